"""Errors of the calibration and export stage."""

from __future__ import annotations

from vigil.errors import VigilError


class CalibrationError(VigilError):
    """A labelled set, verdicts file or calibration request is invalid."""
