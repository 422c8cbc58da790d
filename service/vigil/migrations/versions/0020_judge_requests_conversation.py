"""judge: a conversation's requests by its id, whatever the judge.

Retention deleted conversations but never their judge requests: 0.2 rows per conversation stored stayed
forever (``bench.bench_retention``). It now deletes them with their conversation, along this index; a
claim also finds the newer revision's requests of the conversations it took by it.

Revision ID: 0020_judge_requests_conversation
Revises: 0019_quality_totals
"""

from __future__ import annotations

from alembic import op

revision = "0020_judge_requests_conversation"
down_revision = "0019_quality_totals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_judge_requests_conversation", "judge_requests", ["conversation_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_judge_requests_conversation", table_name="judge_requests")
