"""review stage: trigram indexes for the queue's text search, taken out again (kept as a no-op).

A release created pg_trgm GIN indexes on ``conversations.document`` and ``task_id`` under this revision;
the next one took the indexes out (storing conversations cost 2.5 times as much with them) by deleting
this file, which left every database migrated by that release at a revision no later release knew
("Can't locate revision identified by '0011_search_trgm'": no start, no upgrade). This revision is back
so those databases upgrade again; it creates nothing. ``0012_drop_search_trgm`` joins it to
``0011_otlp_text`` and drops the indexes where they were made.

Revision ID: 0011_search_trgm
Revises: 0010_assign_lapse
"""

from __future__ import annotations

revision = "0011_search_trgm"
down_revision = "0010_assign_lapse"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
