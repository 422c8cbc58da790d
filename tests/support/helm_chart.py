"""Helpers of the Helm chart tests: render the chart through Helm's Go SDK and split the manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.services import missing
from vigil.settings import PROJECT_ROOT

CHART = PROJECT_ROOT / "helm" / "vigil"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.30.0"


def helm():  # type: ignore[no-untyped-def]
    try:
        import helm_python
    except Exception as exc:  # the SDK or its shared library is absent
        missing(f"helm-python-sdk ({exc})")
    return helm_python


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any], name: str = "vigil", namespace: str = "vigil") -> list[dict[str, Any]]:
    """Validate ``values`` against the chart's schema (as an install does), render, parse every document."""
    h = helm()
    with h.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        out = chart.render(values, name=name, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {}).setdefault("annotations", {})
                doc["_template"] = path
                docs.append(doc)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    if len(found) != 1:
        names = [d["metadata"]["name"] for d in found]
        pytest.fail(f"expected one {kind} named *{name_suffix}, found {names}")
    return found[0]
