"""Errors of the calibration and export stage."""

from __future__ import annotations

from ..errors import VigilError


class CalibrationError(VigilError):
    """A labelled set, verdicts file or calibration request is invalid."""


class ExportError(VigilError):
    """An export request is invalid (unknown format, malformed watermark, bad redaction pattern)."""
