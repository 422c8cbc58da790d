"""Fixtures the review tests share: a review runtime on the parametrised database, and its API client."""

from __future__ import annotations

import pytest

from tests.support.review import review_client, review_runtime


@pytest.fixture
def rt(db_url: str):  # type: ignore[no-untyped-def]
    runtime = review_runtime(db_url)
    yield runtime
    runtime.close()


@pytest.fixture
def api(rt):  # type: ignore[no-untyped-def]
    with review_client(rt) as c:
        yield c
