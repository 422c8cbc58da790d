"""Memory a ``POST /v1/conversations`` body takes once decoded, per format, as a multiple of its bytes.

    python -m bench.bench_decoded_memory

The τ² results files in ``../shared/data`` are sent as they are (``?format=tau2``) and, converted, as
Vigil's schema (no ``format``), OpenAI chat records, Anthropic Messages requests and LangSmith run
trees. Each body goes through the handler's own work (``ingest_body`` or ``ingest_formatted``: JSON
parse, format conversion, validation, rules and storing, on SQLite) under ``tracemalloc``; printed is
the peak of what Python allocated meanwhile plus the body itself, over the body's size: measured 14.6
to 20.3, held as ``vigil.ingest.http.DECODED_BYTES_PER_BODY_BYTE``.
"""

from __future__ import annotations

import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.decode import encode_conversation
from vigil.ingest.http import ingest_body, ingest_formatted
from vigil.ingest.importers import read_file
from vigil.settings import Settings

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tau2" / "trajectories"
WARM = orjson.dumps(
    {"conversation_id": "warm", "agent_id": "a", "agent_version": "v", "messages": [{"role": "user", "content": "hi"}]}
)
KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def _openai_message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k in KEEP}
    if "tool_calls" in out:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {**c["function"], "arguments": orjson.dumps(c["function"]["arguments"]).decode()},
            }
            for c in out["tool_calls"]
        ]
    return out


def _anthropic(doc: dict[str, Any]) -> dict[str, Any]:
    system = "\n".join(m["content"] for m in doc["messages"] if m["role"] == "system")
    turns: list[dict[str, Any]] = []
    for m in doc["messages"]:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m.get("content") or ""}
            role, blocks = "user", [block]
        elif m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": c["function"]["arguments"]}
                for c in m.get("tool_calls") or ()
            ]
            role = "assistant"
        else:
            role, blocks = "user", [{"type": "text", "text": m.get("content") or ""}]
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    return {"model": "gpt-4.1", "system": system, "messages": turns}


def _langsmith(doc: dict[str, Any], i: int) -> dict[str, Any]:
    msgs = [_openai_message(m) for m in doc["messages"]]
    run_id = f"00000000-0000-4000-8000-{i:012x}"
    return {
        "id": run_id,
        "trace_id": run_id,
        "name": "agent",
        "run_type": "chain",
        "inputs": {},
        "outputs": {"messages": msgs},
        "child_runs": [],
    }


def bodies(path: Path) -> dict[str, bytes]:
    docs = [orjson.loads(encode_conversation(c)) for c in read_file(path, "tau2").conversations]
    return {
        "native": orjson.dumps(docs),
        "tau2": path.read_bytes(),
        "openai": orjson.dumps([{"messages": [_openai_message(m) for m in d["messages"]]} for d in docs]),
        "anthropic": orjson.dumps([_anthropic(d) for d in docs]),
        "langsmith": orjson.dumps([_langsmith(d, i) for i, d in enumerate(docs)]),
    }


def peak(work: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        answer = work()
        return tracemalloc.get_traced_memory()[1], answer
    finally:
        tracemalloc.stop()


def measure(fmt: str, body: bytes) -> tuple[int, Any]:
    """The peak over a fresh SQLite database (nothing stored as a duplicate of an earlier run), once warm."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/v.db", metrics_port=0, otlp_grpc_port=0, judge_mode="offline"
        )
        rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
        try:
            ingest_body(rt, WARM)  # imports, compiled statements, caches: what every process already holds
            if fmt == "native":
                return peak(lambda: ingest_body(rt, body))
            return peak(lambda: ingest_formatted(rt, body, fmt, None, None))
        finally:
            rt.close()


def main() -> None:
    print(f"{'file':<42} {'format':<10} {'body bytes':>11} {'status':>6} {'held':>6}")
    for path in sorted(DATA.iterdir()):
        for fmt, body in bodies(path).items():
            size, answer = measure(fmt, body)
            note = "" if answer.status == 202 else str(answer.body)[:200]
            held = (size + len(body)) / len(body)
            print(f"{path.name[:42]:<42} {fmt:<10} {len(body):>11,} {answer.status:>6} {held:>5.1f}x {note}")


if __name__ == "__main__":
    main()
