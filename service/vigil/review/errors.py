"""Errors of the review stage; the API maps them to 404, 409 and 422."""

from __future__ import annotations

from vigil.errors import VigilError


class ReviewError(VigilError):
    """Base of review queue errors."""


class NotFound(ReviewError):
    """No such conversation or review item."""


class Conflict(ReviewError):
    """Another reviewer holds the item, or the caller does not hold it."""


class NotHeld(Conflict):
    """Nobody holds the item any more, the caller included (their claim was given back or released)."""


class Done(Conflict):
    """The item has all the reviews it needs: there is nothing to claim (labels can still be changed)."""


class Invalid(ReviewError):
    """A label, category or severity is not one the taxonomy allows."""
