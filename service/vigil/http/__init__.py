"""What every stage's router shares: the app shell, API keys and UI sessions, the conversation read API."""

from __future__ import annotations

from typing import cast

from fastapi import Request

from vigil.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    """The runtime of the app serving ``request``."""
    return cast(Runtime, request.app.state.runtime)
