"""The conversation page shows the tools the agent was offered: descriptions, parameters, how often each was
called, and any tool it called without being offered (which the built-in ``unoffered_tool`` rule flags)."""

from __future__ import annotations

import json
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


def test_the_tools_card_is_bounded_and_counts_what_it_leaves_out(sqlite_url: str) -> None:
    """7,000 calls to as many unoffered tools made a 1.1 MB page of 24,700 nodes: each list is capped."""
    from vigil.ui.transcript import MAX_TOOLS_SHOWN, MAX_UNOFFERED_SHOWN

    offered = [{"name": f"offered_{i}", "description": "d"} for i in range(MAX_TOOLS_SHOWN + 30)]
    doc = conversation("many-tools", offered)
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": f"stray_{i}", "arguments": "{}"}}
        for i in range(MAX_UNOFFERED_SHOWN + 70)
    ]
    calls.append({"id": "again", "type": "function", "function": {"name": f"stray_{MAX_UNOFFERED_SHOWN + 69}"}})
    doc["messages"].insert(1, {"role": "assistant", "content": None, "tool_calls": calls})  # type: ignore[attr-defined]
    rt = review_runtime(sqlite_url)
    store(rt, [doc])
    with review_client(rt) as ui:
        _login(ui)
        html = ui.get("/ui/review/many-tools").text
        section = html[html.index('id="tools"') : html.index("</section>", html.index('id="tools"'))]
        assert f'Tools offered <span class="count">{MAX_TOOLS_SHOWN + 30}</span>' in section
        assert section.count('<li class="tool">') == MAX_TOOLS_SHOWN
        assert section.count('<li class="tool not-offered">') == MAX_UNOFFERED_SHOWN
        assert "and 30 more tools offered" in section
        assert "and 72 more tools called without being offered" in section  # 120 strays and refund_order
        # the most called stray comes first
        assert f"<code>stray_{MAX_UNOFFERED_SHOWN + 69}</code>" in section
    rt.close()


def test_deeply_nested_json_is_shown_as_sent_never_a_500(sqlite_url: str) -> None:
    """orjson lays out at most about 255 levels, the schema admits 1,024: the page fell back to Python's
    repr, which recursion ended (a 500 at about 1,000 levels) and which showed {'a': ...} below that."""
    deep_text = "[" * 1000 + "]" * 1000
    deep_args: object = "x"
    for _ in range(700):
        deep_args = {"a": deep_args}
    doc = conversation("deep", TOOLS)
    msgs = doc["messages"]
    msgs[2]["content"] = deep_text  # type: ignore[index]  # a tool result
    msgs[3]["tool_calls"][0]["function"]["arguments"] = deep_args  # type: ignore[index]
    rt = review_runtime(sqlite_url)
    with review_client(rt) as ui:
        # over HTTP, as an agent sends it: the document is stored as the bytes that came (orjson writes
        # at most 255 levels, so no other way in stores it)
        body = json.dumps(doc)
        sent = ui.post("/v1/conversations", content=body, headers={"Authorization": "Bearer ingest-key"})
        assert sent.status_code == 202, sent.text
        _login(ui)
        r = ui.get("/ui/review/deep")
        assert r.status_code == 200, r.text[:300]
        assert deep_text in r.text  # the result as sent
        assert "{&#34;a&#34;:{&#34;a&#34;:" in r.text and "{&#39;a&#39;" not in r.text  # JSON, not a repr
    rt.close()


def test_a_blank_task_links_to_no_side_by_side(sqlite_url: str) -> None:
    doc = conversation("blank-task", None)
    doc["task_id"] = "  "
    named = conversation("named-task", None)
    named["task_id"] = "t-1"
    other = conversation("named-task-v2", None)  # the link shows only when another version ran the task
    other.update(task_id="t-1", agent_version="v2")
    rt = review_runtime(sqlite_url)
    store(rt, [doc, named, other])
    with review_client(rt) as ui:
        _login(ui)
        assert 'id="side-by-side"' not in ui.get("/ui/review/blank-task").text
        assert 'id="side-by-side"' in ui.get("/ui/review/named-task").text
    rt.close()


def test_a_long_system_prompt_opens_with_its_first_lines_and_folds_the_rest(sqlite_url: str) -> None:
    """A 16 kB policy as the system prompt pushed the conversation three screens down on every τ² review:
    its first lines show, the rest is one click away (a <details>, no script), and nothing of it is lost."""
    from vigil.ui.transcript import LONG_SYSTEM, build

    policy = "# Policy\nThe current time is 2025-02-25 12:08.\n\n" + "".join(
        f"- rule {i}: never do thing {i} without <b>asking</b>\n" for i in range(400)
    )
    short = "You are a retail support agent."
    assert len(policy) > LONG_SYSTEM
    docs = []
    for cid, system in (("long-policy", policy), ("short-policy", short)):
        doc = conversation(cid, None)
        doc["messages"] = [{"role": "system", "content": system}, *doc["messages"]]  # type: ignore[misc]
        docs.append(doc)
    rt = review_runtime(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "default.yaml"))
    store(rt, docs)
    with review_client(rt) as ui:
        _login(ui)
        html = ui.get("/ui/review/long-policy").text
        head = html[html.index('id="m0"') : html.index('id="m1"')]
        assert "The current time is 2025-02-25 12:08." in head.split('<details class="rest"')[0]
        assert '<details class="rest" id="rest-0">' in head and "more lines" in head
        assert "rule 399: never do thing 399 without &lt;b&gt;asking&lt;/b&gt;" in head  # folded, escaped, all there
        assert "details" not in ui.get("/ui/review/short-policy").text.split('id="m0"')[1].split('id="m1"')[0]

    # the opening and the rest are the whole text; evidence inside the prompt keeps it unfolded
    [view] = build({"messages": [{"role": "system", "content": policy}]}, [])
    assert view.rest and "".join(s.text for s in view.segments) + view.rest == policy
    assert view.rest_lines == view.rest.count("\n") + 1
    finding = {"severity": "high", "evidence": [{"message_index": 0, "start": 9000, "end": 9010}]}
    [view] = build({"messages": [{"role": "system", "content": policy}]}, [finding])
    assert view.rest is None and "".join(s.text for s in view.segments) == policy
    [view] = build({"messages": [{"role": "system", "content": "x" * (LONG_SYSTEM + 1)}]}, [])  # one long line
    assert (
        view.rest and len(view.segments[0].text) <= 600 and view.segments[0].text + view.rest == "x" * (LONG_SYSTEM + 1)
    )
    rt.close()


def test_a_huge_message_opens_with_a_screenful_and_folds_the_rest(sqlite_url: str) -> None:
    """A tool that returned 900 kB made the review page 234,000 pixels tall: the messages after it, and
    the answer a reviewer judges, were a long scroll away. Any message over LONG_MESSAGE characters shows
    its opening and folds the rest; nothing of it is lost, and one a finding points into stays whole."""
    from vigil.ui.transcript import LONG_MESSAGE, build

    dump = "\n".join(f'{{"row": {i}, "name": "customer {i}", "note": "<i>vip</i>"}}' for i in range(12_000))
    assert len(dump) > LONG_MESSAGE
    doc = conversation("huge-tool", None)
    doc["messages"] = [  # type: ignore[misc]
        {"role": "user", "content": "List my orders."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "dump_table", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": dump},
        {"role": "assistant", "content": "You have 12,000 orders."},
    ]
    rt = review_runtime(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "default.yaml"))
    store(rt, [doc])
    with review_client(rt) as ui:
        _login(ui)
        html = ui.get("/ui/review/huge-tool").text
        tool = html[html.index('id="m2"') : html.index('id="m3"')]
        opening = tool.split('<details class="rest"')[0]
        assert "&#34;row&#34;: 0," in opening and "&#34;row&#34;: 40," not in opening  # 40 lines
        assert "The rest of this message (" in tool and "&lt;i&gt;vip&lt;/i&gt;" in tool
        assert "&#34;row&#34;: 11999," in tool  # folded, all there
    [_, _, view, _] = build(doc, [])
    assert view.rest and "".join(s.text for s in view.segments) + view.rest == dump
    # a finding far into it: the opening, then the text around the evidence (highlighted), the rest folded
    finding = {"severity": "high", "evidence": [{"message_index": 2, "start": 100_000, "end": 100_010}]}
    view = build(doc, [finding])[2]
    window = "".join(s.text for s in view.segments)
    assert view.lead is not None and view.middle is not None and view.rest is not None
    assert view.lead + view.middle + window + view.rest == dump
    assert len(window) == 2_010 and len(view.lead) <= 4_000
    [marked] = [s for s in view.segments if s.findings]
    assert marked.text == dump[100_000:100_010] and marked.findings == [0]
    # a reply cut off at 900 kB, flagged at its last characters (empty-or-truncated): it kept the whole
    # message on the page, 234,000 pixels tall
    cut = {"role": "assistant", "content": "A" * 900_000}
    flagged = {"severity": "medium", "evidence": [{"message_index": 0, "start": 899_980, "end": 900_000}]}
    [view] = build({"messages": [cut]}, [flagged])
    assert view.rest is None and view.lead and view.middle
    assert len(view.lead) + len(view.middle) + sum(len(s.text) for s in view.segments) == 900_000
    assert sum(len(s.text) for s in view.segments) == 1_020
    # evidence near the start of a long message: no opening of its own, the window starts at the top
    early = {"severity": "low", "evidence": [{"message_index": 0, "start": 10, "end": 20}]}
    [view] = build({"messages": [cut]}, [early])
    assert view.lead is None and view.middle is None and len("".join(s.text for s in view.segments)) == 1_020
    # evidence all over it: nothing worth folding
    spread = {"severity": "low", "evidence": [{"message_index": 0, "start": 5, "end": 899_995}]}
    [view] = build({"messages": [cut]}, [spread])
    assert view.lead is None and view.rest is None and "".join(s.text for s in view.segments) == "A" * 900_000
    rt.close()


def test_an_outcome_says_whether_the_task_succeeded() -> None:
    """A τ² run's reward as the outcome chip: "task success 0.0" read as a success at a glance."""
    from vigil.ui.labels import outcome_label

    assert outcome_label({"type": "task_success", "value": 1.0}) == "task succeeded"
    assert outcome_label({"type": "task_success", "value": 0.0}) == "task failed (reward 0)"
    assert outcome_label({"type": "task_success", "value": 0.25}) == "task failed (reward 0.25)"
    assert outcome_label({"type": "thumbs_down", "value": 1}) == "thumbs down"
    assert outcome_label({"type": "csat", "value": 4.5}) == "csat 4.5"
    assert outcome_label({"type": "escalation", "value": None}) == "escalation"


def test_a_review_reason_of_a_failed_task_says_so() -> None:
    """The queue's chip read "outcome: task_success" for an item a failed task flagged."""
    from vigil.ui.labels import reason_key

    assert reason_key({"kind": "outcome", "key": "task_success"}) == "task failed"
    assert reason_key({"kind": "outcome", "key": "escalation"}) == "escalation"
    assert reason_key({"kind": "finding", "key": "task_success"}) == "task_success"  # a rule of that name


def test_the_cli_queue_says_a_failed_task_too(sqlite_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.support.cli import cli_runner
    from tests.support.console import console_runtime
    from vigil.app.cli import app

    rt = console_runtime(sqlite_url)  # every stage: the outcome join flags the failed task
    store(rt, [conversation("failed-run", None)])
    sink = rt.hooks.outcome_sink
    assert sink is not None
    sink([{"conversation_id": "failed-run", "type": "task_success", "value": 0.0, "idempotency_key": "ts-1"}])
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("COLUMNS", "250")
    out = cli_runner().invoke(app, ["review", "queue"])
    assert out.exit_code == 0, out.output
    assert "outcome:task failed" in out.stdout and "outcome:task_success" not in out.stdout
