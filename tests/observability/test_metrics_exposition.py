"""``/metrics`` (the API's and a worker's) negotiates OpenMetrics and gzip; no ``*_created`` series."""

from __future__ import annotations

import gzip
import urllib.request

from prometheus_client import CollectorRegistry

from tests.support.app import make_client, make_settings
from tests.support.services import free_port, wait_port
from vigil.app.runtime import build_runtime
from vigil.app.server import start_metrics_server

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def test_api_metrics_negotiate_openmetrics_and_gzip(sqlite_url: str) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    client = make_client(rt)
    rt.metrics.conversations_processed.labels("a", "v1", "http").inc()
    plain = client.get("/metrics", headers={"accept-encoding": "identity"})
    assert plain.headers["content-type"].startswith("text/plain") and "content-encoding" not in plain.headers
    assert "vigil_conversations_processed_total{" in plain.text and "_created" not in plain.text
    om = client.get("/metrics", headers={"accept": OPENMETRICS, "accept-encoding": "gzip"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.headers["content-encoding"] == "gzip"  # httpx decompressed it for .text
    assert om.text.rstrip().endswith("# EOF") and "_created" not in om.text
    rt.close()


def test_worker_metrics_server_negotiates_too(sqlite_url: str) -> None:
    port = free_port()
    rt = build_runtime(
        make_settings(sqlite_url, metrics_port=port, metrics_host="127.0.0.1"), registry=CollectorRegistry()
    )
    start_metrics_server(rt)
    assert wait_port(port)
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        body = gzip.decompress(r.read()).decode()
    assert body.rstrip().endswith("# EOF") and "vigil_" in body and "_created" not in body
    rt.close()
