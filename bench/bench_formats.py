"""Import cost per message format: detection plus conversion of the same tool-calling conversation, written
in each format, against the native decoder on Vigil's own schema (CPU time per 1,000 conversations).

    python -m bench.bench_formats --n 2000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from vigil.ingest.decode import decode_conversation
from vigil.ingest.importers import convert_data


def _samples() -> dict[str, Callable[[int], Any]]:
    from tests.ingest.test_formats import (
        LOOKUP_TOOL,
        agents_responses_model_trace,
        anthropic_record,
        openai_chat_record,
        responses_input,
        responses_response,
    )

    chat, claude = openai_chat_record(), anthropic_record("sys")
    responses = {"model": "gpt-5", "input": responses_input(), "tools": [LOOKUP_TOOL], "response": responses_response()}
    agents = agents_responses_model_trace()

    def native(i: int) -> bytes:
        msgs = chat["messages"][1:] + [chat["response"]["choices"][0]["message"]]
        doc = {"conversation_id": f"c{i}", "agent_id": "a", "agent_version": "v", "messages": msgs}
        return orjson.dumps({**doc, "tools": chat["tools"]})

    def traced(i: int) -> dict[str, Any]:
        data = orjson.loads(orjson.dumps(agents))
        for x in data["data"]:
            x["trace_id" if x["object"] == "trace.span" else "id"] = f"trace_{i}"
        return data

    return {
        "native (decoder)": native,
        "openai": lambda i: {**chat, "conversation_id": f"c{i}"},
        "openai-responses": lambda i: {**responses, "conversation_id": f"r{i}"},
        "anthropic": lambda i: {**claude, "conversation_id": f"a{i}"},
        "openai-agents": traced,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="conversations per format")
    n = parser.parse_args().n
    print(f"{'format':<20} {'conv/s':>10} {'CPU-s per 1,000':>16}")
    for name, make in _samples().items():
        items = [make(i) for i in range(n)]
        t0 = time.process_time()
        if name.startswith("native"):
            for raw in items:
                decode_conversation(raw, 1 << 22)
        else:
            for item in items:
                convert_data(item, "auto")
        cpu = time.process_time() - t0
        print(f"{name:<20} {n / cpu:>10.0f} {cpu / n * 1000:>16.3f}")


if __name__ == "__main__":
    main()
