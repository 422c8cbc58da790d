"""Property-based fuzzing of the API against its own OpenAPI document (schemathesis): whatever a client
sends that the document allows, and much that it does not, no operation answers 500, and every answer
that the document describes matches its schema. In-process on SQLite with the admin key; a bounded
number of examples per operation keeps the run short (VIGIL_TEST_FUZZ_EXAMPLES raises it;
VIGIL_TEST_FUZZ_POSTGRES=1 runs it on PostgreSQL, which refuses more, e.g. NUL in text)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from prometheus_client import CollectorRegistry
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.support.app import ADMIN, make_settings
from tests.support.services import postgres_database

MAX_EXAMPLES = int(os.environ.get("VIGIL_TEST_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from vigil.app.runtime import build_runtime
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    with ExitStack() as stack:
        if os.environ.get("VIGIL_TEST_FUZZ_POSTGRES") == "1":
            url = stack.enter_context(postgres_database())
        else:
            url = f"sqlite:///{Path(tmp_path_factory.mktemp('fuzz')) / 'vigil.db'}"
        rt = wire(build_runtime(make_settings(url), registry=CollectorRegistry()), {"api"})
        stack.callback(rt.close)
        yield schemathesis.openapi.from_asgi("/openapi.json", build_app(rt, []))


def operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_operation_answers_500_and_answers_match_the_document(api_schema: Any, mode: GenerationMode) -> None:
    """Valid requests (as the document allows) and invalid ones (wrong types, out-of-range numbers,
    missing fields): none answers 500, and every documented answer matches its schema."""
    ops = operations(api_schema)
    assert len(ops) >= 30  # every stage's routes are in the document
    failures: list[str] = []
    for op in ops:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case: Any) -> None:
            case.call_and_validate(headers=ADMIN, checks=[not_a_server_error, response_schema_conformance])

        try:
            fuzz()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # an operation with nothing to get wrong has no invalid case
        except (Exception, BaseExceptionGroup) as exc:  # every operation's failure, not only the first
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
