"""Join the two revisions after 0010 (``0011_otlp_text`` and the no-op ``0011_search_trgm``) and drop
the trigram indexes a release made under the second, which slow every stored conversation down.

Revision ID: 0012_drop_search_trgm
Revises: 0011_otlp_text, 0011_search_trgm
"""

from __future__ import annotations

from alembic import op

revision = "0012_drop_search_trgm"
down_revision = ("0011_otlp_text", "0011_search_trgm")
branch_labels = None
depends_on = None

INDEXES = ("ix_conversations_task_trgm", "ix_conversations_document_trgm")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")


def downgrade() -> None:
    pass  # the indexes are not made again: 0011_search_trgm no longer makes them
