"""A scripted OpenAI-compatible chat-completions server on a free local port (the LLM provider the tests fake).

Each reply is chosen by how many tool results the request already carries, so a real ``openai`` client
running an agent loop gets: a call to the first scripted tool, then the next, then the final answer.
``stream: true`` is answered as server-sent events, chunk by chunk, as the real API does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Script:
    """Tool calls to make, in order (name, arguments), then the final answer."""

    calls: list[tuple[str, dict[str, Any]]] = field(
        default_factory=lambda: [
            ("get_order_details", {"order_id": "#W1"}),
            ("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}),
        ]
    )
    answer: str = "Order #W1 is cancelled."
    requests: list[dict[str, Any]] = field(default_factory=list)
    # count only tool results beyond those of the first request (a replayed history already holds some)
    relative: bool = False
    _baseline: int | None = None
    # provider trouble on demand: called per request; an int answers that HTTP status (429 with
    # Retry-After: 1), (status, message) that status with the provider's error message, a float hangs
    # that many seconds before the normal reply, bytes answers 200 with that body (a reply no client can
    # read), None replies normally
    fault: Callable[[], int | tuple[int, str] | float | bytes | None] | None = None
    # the same, chosen by the request's body (a provider that refuses one request's content)
    fault_for: Callable[[dict[str, Any]], int | tuple[int, str] | float | bytes | None] | None = None

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if self.relative:
            if self._baseline is None:
                self._baseline = done
            done -= self._baseline
        message: dict[str, Any]
        if done < len(self.calls):
            name, args = self.calls[done]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{done + 1}" if not self.relative else f"call_scripted_{done + 1}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": self.answer}, "stop"
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "gpt-4o-mini"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }


def _chunks(reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    msg = reply["choices"][0]["message"]
    delta: dict[str, Any] = {"role": "assistant"}
    if msg.get("content"):
        delta["content"] = msg["content"]
    if msg.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
    yield base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    yield base | {"choices": [{"index": 0, "delta": {}, "finish_reason": reply["choices"][0]["finish_reason"]}]}
    yield base | {"choices": [], "usage": reply["usage"]}


class _Handler(BaseHTTPRequestHandler):
    script: Script

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        trouble = self.script.fault() if self.script.fault else None
        if trouble is None and self.script.fault_for is not None:
            trouble = self.script.fault_for(body)
        if isinstance(trouble, bytes):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(trouble)))
            self.end_headers()
            self.wfile.write(trouble)
            return
        if isinstance(trouble, tuple):
            trouble, message = trouble
        else:
            message = f"fake provider status {trouble}"
        if isinstance(trouble, int):
            err = json.dumps({"error": {"message": message, "type": "fake"}}).encode()
            self.send_response(trouble)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(err)))
            if trouble == 429:
                self.send_header("retry-after", "1")
            self.end_headers()
            self.wfile.write(err)
            return
        if isinstance(trouble, float):
            time.sleep(trouble)
        reply = self.script.reply(body)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for chunk in _chunks(reply):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        out = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up on a hung reply
            super().handle_error(request, client_address)


@contextmanager
def fake_openai(script: Script | None = None) -> Iterator[tuple[str, Script]]:
    """``(base_url, script)`` of a running server; ``base_url`` ends in ``/v1`` like the real API's."""
    script = script or Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", script
    finally:
        server.shutdown()
        server.server_close()
