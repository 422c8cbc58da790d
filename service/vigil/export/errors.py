"""Errors of the export stage."""

from __future__ import annotations

from vigil.errors import VigilError


class ExportError(VigilError):
    """An export request is invalid (unknown format, malformed watermark, bad redaction pattern)."""
