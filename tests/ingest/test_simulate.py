"""What `vigil simulate` and `vigil serve --demo` generate."""

from __future__ import annotations

from datetime import UTC, datetime

from vigil.ingest.simulate import Simulator, parse_versions


def test_nothing_simulated_is_dated_after_now() -> None:
    """The demo showed outcomes dated two days ahead ("2026-12-09 11:04" on the 7th): a refund reversal
    48 h after its conversation was sent with it; and 1,000 conversations made at once, 50 ms apart from
    now, ended up to 50 s ahead. Outcomes still follow their conversation."""
    sim = Simulator(parse_versions("v1:1.0"), seed=7, outcome_rate_scale=3.0)
    convs = list(sim.stream(1000))
    outcomes = [(c, o) for c in convs for o in sim.outcomes_for(c)]
    now = datetime.now(UTC)
    assert {o["type"] for _, o in outcomes} >= {"refund_reversal", "reopened_ticket", "escalation"}
    for c in convs:
        started, ended = datetime.fromisoformat(c["started_at"]), datetime.fromisoformat(c["ended_at"])
        assert started < ended <= now, c["conversation_id"]
    for c, o in outcomes:
        assert datetime.fromisoformat(c["ended_at"]) <= datetime.fromisoformat(o["occurred_at"]) <= now, o


def test_a_given_start_keeps_its_history() -> None:
    """A run given a start in the past keeps its delays: outcomes a day or two after their conversation."""
    start = datetime(2026, 1, 5, tzinfo=UTC)
    sim = Simulator(parse_versions("v1:1.0"), seed=7, outcome_rate_scale=3.0)
    conv = next(sim.stream(1, start=start))
    assert conv["started_at"] == start.isoformat()
    drawn = (o for _ in range(200) for o in sim.outcomes_for(conv))
    late = [o for o in drawn if o["type"] == "refund_reversal"]
    delay = datetime.fromisoformat(late[0]["occurred_at"]) - datetime.fromisoformat(conv["ended_at"])
    assert delay.total_seconds() >= 24 * 3600
