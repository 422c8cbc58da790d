"""Imports every stage's tables so that Alembic and tests see one complete metadata."""

from __future__ import annotations

from sqlalchemy import MetaData


def metadata() -> MetaData:
    from . import models

    return models.Base.metadata
