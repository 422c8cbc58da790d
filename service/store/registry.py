"""Imports every stage's tables so that Alembic and tests see one complete metadata."""

from __future__ import annotations

from sqlalchemy import MetaData

MODEL_MODULES = [
    "service.store.models",
    "service.judge.models",
    "service.review.models",
    "service.outcomes.models",
    "service.detector.models",
    "service.calibration.models",
    "service.tracing.models",
]


def metadata() -> MetaData:
    import importlib

    for name in MODEL_MODULES:
        importlib.import_module(name)
    from .models import Base

    return Base.metadata
