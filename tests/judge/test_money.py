"""Money is shown to the cent or finer: a budget under a cent is never "$0.00"."""

from __future__ import annotations

import pytest

from vigil.money import usd


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        (5.0, "$5.00"),
        (1234.5, "$1,234.50"),
        (0.25, "$0.25"),
        (0.1, "$0.10"),
        (0.01, "$0.01"),
        (0.005, "$0.005"),
        (0.0049, "$0.0049"),
        (0.00012345, "$0.00012"),
        (0.0, "$0.00"),
        (None, "–"),
        (-0.003, "-$0.003"),
    ],
)
def test_usd(amount: float | None, shown: str) -> None:
    assert usd(amount) == shown
