"""The conversation page shows the tools the agent was offered: descriptions, parameters, how often each was
called, and any tool it called without being offered (which the built-in ``unoffered_tool`` rule flags)."""

from __future__ import annotations

import re

from tests.support.review import review_client, review_runtime, store
from vigil.settings import PROJECT_ROOT

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look an order up by its id.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    },
    {"name": "transfer_to_human_agents", "description": "Hand over <b>to a human</b>.", "input_schema": {}},
]


def conversation(cid: str, tools: list[dict[str, object]] | None) -> dict[str, object]:
    calls = [("k1", "get_order_details", '{"order_id": "#W1"}'), ("k2", "refund_order", '{"order_id": "#W1"}')]
    messages: list[dict[str, object]] = [{"role": "user", "content": "Refund #W1"}]
    for call_id, name, args in calls:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "{}"},
        ]
    messages.append({"role": "assistant", "content": "Refunded.", "reasoning": "The <i>user</i> asked twice."})
    doc: dict[str, object] = {"conversation_id": cid, "agent_id": "shop", "agent_version": "v1", "messages": messages}
    if tools is not None:
        doc["tools"] = tools
    return doc


def _login(ui) -> None:  # type: ignore[no-untyped-def]
    page = ui.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    ui.post("/ui/login", data={"csrf": csrf, "api_key": "rita-key", "next": "/ui/queue"})


def test_conversation_page_lists_the_offered_tools_and_an_unoffered_call(sqlite_url: str) -> None:
    rt = review_runtime(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "default.yaml"))
    store(rt, [conversation("with-tools", TOOLS), conversation("without-tools", None)])
    with review_client(rt) as ui:
        _login(ui)
        html = ui.get("/ui/review/with-tools").text
        section = html[html.index('id="tools"') : html.index("</section>", html.index('id="tools"'))]
        assert 'Tools offered <span class="count">2</span>' in section
        assert "<code>get_order_details</code>" in section and "called 1×" in section
        assert "Look an order up by its id." in section and "&#34;order_id&#34;" in section  # the schema, escaped
        assert "<code>transfer_to_human_agents</code>" in section and "not called" in section
        assert "Hand over &lt;b&gt;to a human&lt;/b&gt;." in section  # descriptions are text, never markup
        assert "<code>refund_order</code>" in section and "called 1× but not offered" in section
        assert "called-unoffered-tool" in html  # the rule's finding, on the refund call
        assert "<summary>reasoning</summary>" in html and "The &lt;i&gt;user&lt;/i&gt; asked twice." in html
        # a conversation that does not carry its tools shows no tools section, and the rule stays quiet
        html = ui.get("/ui/review/without-tools").text
        assert 'id="tools"' not in html and "called-unoffered-tool" not in html
    rt.close()
