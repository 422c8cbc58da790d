"""detector: each series' counts summed over every hour (``quality_totals``), and the hours by time.

Every detector pass summed all of ``quality_counts`` three times (baselines twice, the gauges once on every
replica), and each alert on ``/ui/alerts`` summed its series' every hour twice: at 50 series x 2 years a pass
read 2.6M rows and took 825 ms. The totals are kept by whatever changes the hourly counts; this fills them
from the counts stored so far. The index on ``hour`` serves the reads of the newest hours of every series
(a baseline's recent hours, the home page's last day).

Revision ID: 0019_quality_totals
Revises: 0018_outcomes_received
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_quality_totals"
down_revision = "0018_outcomes_received"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quality_totals",
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=128), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "agent_version", "signal"),
    )
    op.execute(
        "INSERT INTO quality_totals (agent_id, agent_version, signal, n, x) "
        "SELECT agent_id, agent_version, signal, sum(n), sum(x) FROM quality_counts "
        "GROUP BY agent_id, agent_version, signal"
    )
    op.create_index("ix_quality_counts_hour", "quality_counts", ["hour"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_quality_counts_hour", table_name="quality_counts")
    op.drop_table("quality_totals")
