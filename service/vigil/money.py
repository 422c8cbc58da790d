"""Money as Vigil shows it (API texts, CLI, UI): to the cent, finer when smaller, never a sub-cent as $0.00."""

from __future__ import annotations

import math


def usd(amount: float | None) -> str:
    """``$1,234.50``, ``$0.25``, ``$0.005``, ``$0.00012``: two significant digits below a dollar, at least cents."""
    if amount is None:
        return "–"
    if amount == 0:
        return "$0.00"
    sign, x = ("-" if amount < 0 else ""), abs(amount)
    if x >= 1:
        return f"{sign}${x:,.2f}"
    decimals = max(2, 1 - math.floor(math.log10(x)))
    text = f"{x:.{decimals}f}"
    if decimals > 2:
        text = text.rstrip("0")
        if len(text.split(".")[1]) < 2:
            text = f"{x:.2f}"
    return f"{sign}${text}"
