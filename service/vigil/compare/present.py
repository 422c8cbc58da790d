"""How the compare table reads, the same in the API, the CLI and the UI: a headline, worse rows first,
rows where both sides are zero folded away, differences of rates in percentage points, money as money."""

from __future__ import annotations

from typing import Any

from vigil.money import usd

WORSE, BETTER, GRADER_CHANGED, NO_DATA = "worse", "better", "grader changed", "no data"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """``v1.5.0 vs v1.4.0: 4 signals worse, 0 better, 1 red flag`` and its counts.

    Counted: the tested rows (informational rows, such as pass@k, and rows whose grader changed are not).
    """
    rows = [r for r in result["signals"] if not r.get("informational")]
    worse = sum(1 for r in rows if r["verdict"] == WORSE)
    better = sum(1 for r in rows if r["verdict"] == BETTER)
    flags = sum(1 for r in rows if r["red_flag"])
    changed = sum(1 for r in rows if r["verdict"] == GRADER_CHANGED)
    text = (
        f"{result['candidate']['version']} vs {result['baseline']['version']}: "
        f"{_plural(worse, 'signal')} worse, {better} better, {_plural(flags, 'red flag')}"
    )
    if changed:
        text += f"; {_plural(changed, 'signal')} not comparable (grader changed)"
    return {"text": text, "worse": worse, "better": better, "red_flags": flags, "grader_changed": changed}


def both_zero(row: dict[str, Any]) -> bool:
    """A rate measured as zero on both sides: nothing to look at. A side with no data (an outcome rate whose
    outcomes are not in yet) is not zero, and its row stays in the table saying so."""
    b, c = row["baseline"].get("value"), row["candidate"].get("value")
    return row["kind"] == "rate" and b is not None and c is not None and not b and not c


_ORDER = {WORSE: 0, BETTER: 2, GRADER_CHANGED: 3}


def ordered(signals: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows to show, rows folded): worse first (red flags at the top), better after the undecided, then
    rows whose grader changed, informational rows last; rates zero on both sides are folded."""

    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        rank = _ORDER.get(r["verdict"], 1)
        if r.get("informational"):
            rank = 4
        elif r["verdict"] == NO_DATA:
            rank = 5
        return (rank, 0 if r["red_flag"] else 1, 0)

    shown = sorted((r for r in signals if not both_zero(r)), key=key)  # stable: the table's own order within
    return shown, [r for r in signals if both_zero(r)]


def unit(row: dict[str, Any]) -> str:
    if row["kind"] == "rate":
        return "rate"
    if row["signal"].startswith("cost"):
        return "usd"
    if row["signal"].startswith("latency"):
        return "ms"
    return "number"


def value(row: dict[str, Any], estimate: dict[str, Any]) -> str:
    v = estimate.get("value")
    if v is None:
        return "–"
    u = unit(row)
    if u == "rate":
        return f"{100 * v:.1f}%"
    if u == "usd":
        return usd(v)
    if u == "ms":
        return f"{v:,.0f} ms"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"


def interval(row: dict[str, Any], estimate: dict[str, Any]) -> str:
    lo, hi = estimate.get("low"), estimate.get("high")
    if lo is None or hi is None:
        return ""
    return f"[{value(row, {'value': lo})}, {value(row, {'value': hi})}]"


def _signed(row: dict[str, Any], v: float) -> str:
    """A signed figure; the sign is that of the figure as shown (no ``-0.0``)."""
    u = unit(row)
    if u == "rate":
        text = f"{abs(100 * v):.1f}"
    elif u == "usd":
        text = usd(abs(v))
    elif u == "ms":
        text = f"{abs(v):,.0f}"
    else:
        text = f"{abs(v):,.3g}"
    shown_zero = not any(ch in "123456789" for ch in text)
    sign = "±" if shown_zero else "+" if v > 0 else "-"
    return f"{sign}{text}"


def difference(row: dict[str, Any]) -> str:
    """The candidate-minus-baseline difference: rates in percentage points (``+5.0 pp``)."""
    d = row["difference"]
    if d.get("value") is None:
        return "–"
    suffix = {"rate": " pp", "ms": " ms"}.get(unit(row), "")
    return f"{_signed(row, d['value'])}{suffix}"


def difference_interval(row: dict[str, Any]) -> str:
    d = row["difference"]
    if d.get("low") is None or d.get("high") is None:
        return ""
    return f"[{_signed(row, d['low'])}, {_signed(row, d['high'])}]"


def standard_error(row: dict[str, Any]) -> str:
    se = row["difference"].get("se")
    if se is None:
        return ""
    return f"SE {100 * se:.1f} pp" if unit(row) == "rate" else f"SE {se:,.3g}"
