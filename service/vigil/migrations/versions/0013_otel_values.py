"""ingest stage (OTLP): long attribute values that several conversations send (their instructions), stored
once under their digest instead of in each conversation's spans (``{"$val": DIGEST}``); from this revision
on, a span's history may also name the previous span's output instead of repeating it (``"out"`` in an
``$ext`` reference), and a value the exporter sent that looks like a reference is kept as ``{"$lit": VALUE}``.
Releases before it read none of these: downgrading writes the spans of every conversation holding one
back whole.

Revision ID: 0013_otel_values
Revises: 0012_drop_search_trgm
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_otel_values"
down_revision = "0012_drop_search_trgm"
branch_labels = None
depends_on = None


# spans whose JSON may hold what this revision reads as a reference (a cheap filter: text can match too)
_NEW_MARKERS = ('%"$val"%', '%"$lit"%')
_DOWNGRADED = (*_NEW_MARKERS, '%"out"%')


def _filtered(select: str, patterns: tuple[str, ...]) -> sa.TextClause:
    # CAST: SQLite holds span JSON as a BLOB (the bytes orjson wrote), which LIKE does not match
    where = " OR ".join(f"CAST(span AS TEXT) LIKE :p{i}" for i in range(len(patterns)))
    return sa.text(f"{select} WHERE {where}").bindparams(**{f"p{i}": p for i, p in enumerate(patterns)})


def upgrade() -> None:
    op.create_table(
        "otel_values",
        sa.Column("digest", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("touched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_index("ix_otel_values_touched", "otel_values", ["touched_at"], unique=False)
    # a value an exporter sent shaped like {"$val": ...} or {"$lit": ...}, stored by an earlier release as
    # it came, is the exporter's: kept as {"$lit": value} so it is not read as a reference from now on
    import orjson

    bind = op.get_bind()
    update = sa.text("UPDATE otel_spans SET span = :span WHERE id = :id")
    for row_id, stored in bind.execute(_filtered("SELECT id, span FROM otel_spans", _NEW_MARKERS)).all():
        span = orjson.loads(stored)
        attrs = span.get("attributes") or {}
        odd = {k for k, v in attrs.items() if isinstance(v, dict) and ("$val" in v or "$lit" in v)}
        if odd:
            span["attributes"] = {k: {"$lit": v} if k in odd else v for k, v in attrs.items()}
            bind.execute(update, {"span": orjson.dumps(span).decode(), "id": row_id})


def downgrade() -> None:
    import orjson

    from vigil.ingest.otlp.compact import expand

    bind = op.get_bind()
    values: dict[str, str] = {d: v for d, v in bind.execute(sa.text("SELECT digest, value FROM otel_values"))}
    # the conversations holding a span the older releases cannot read: their keys only, not their spans
    newer = bind.execute(_filtered("SELECT DISTINCT conversation_key FROM otel_spans", _DOWNGRADED)).scalars().all()
    update = sa.text("UPDATE otel_spans SET span = :span WHERE id = :id")
    columns = "id, trace_id, span_id, start_ns, end_ns, span"
    for key in newer:
        rows = bind.execute(
            sa.text(f"SELECT {columns} FROM otel_spans WHERE conversation_key = :key ORDER BY start_ns, id"),
            {"key": key},
        ).all()
        spans = []
        for row_id, trace_id, span_id, start, end, stored in rows:
            span = orjson.loads(stored)
            attrs = span.get("attributes") or {}
            for k, v in list(attrs.items()):
                if isinstance(v, dict) and list(v) == ["$val"]:
                    if v["$val"] in values:
                        attrs[k] = values[v["$val"]]
                    else:
                        del attrs[k]
            spans.append(
                {
                    **span,
                    "attributes": attrs,
                    "trace_id": trace_id,
                    "span_id": span_id,
                    "start_ns": start,
                    "end_ns": end,
                    "_row": row_id,
                }
            )
        for span in expand(spans):  # every value whole: what the older releases read
            row_id = span.pop("_row")
            for column in ("trace_id", "span_id", "start_ns", "end_ns"):
                del span[column]
            bind.execute(update, {"span": orjson.dumps(span).decode(), "id": row_id})
    op.drop_index("ix_otel_values_touched", table_name="otel_values")
    op.drop_table("otel_values")
