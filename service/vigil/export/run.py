"""An export run: confirmed failures not yet exported (in this format) become tasks, near-duplicates fold.

A folded group's task keeps the first member's conversation and every member's reviewer notes and
expected behaviour (each distinct text once).

"Confirmed" is the review stage's own rule (:func:`vigil.store.reads.confirmed_failures`: current
labels lean to ``confirmed_failure``). Each run records which conversations it covered, and at which
revision, in ``exported_tasks`` (unique per format, conversation and revision), so the next run skips them
unless their labels confirm a newer revision; ``all_`` ignores that record and exports everything again. A
task of a conversation exported before at an older revision (in any format) has ``-r<revision>`` after its
task id: the newer task is told apart from the one it replaces, while every other task keeps its id. The
watermark is the highest review label id a run saw; ``since`` keeps only failures whose confirming label is
newer than a watermark. Nothing is committed here: the caller commits after the output is safely written,
so a failed write exports the same tasks again next time.

A caller that cannot know whether its output arrived (an HTTP response) passes ``record=False``: the run is
``pending`` and keeps its records until :func:`acknowledge`, so an export whose download was lost is
exported again by the next run.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.export.checks import checkable, model_graded
from vigil.export.errors import ExportError
from vigil.export.formats import FORMATS, render
from vigil.export.models import ExportedTaskRow, ExportRunRow
from vigil.export.redact import Redactor, redact_task
from vigil.export.tasks import Source, build, dumps
from vigil.metrics import Metrics
from vigil.rules.packs import CompiledRule
from vigil.schema import Conversation
from vigil.store import reads
from vigil.store.db import aware, upsert, utcnow
from vigil.store.models import ConversationRow, FindingRow, VerdictRow

_CHUNK = 500
log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    run_id: int
    format: str
    watermark: int
    lines: list[bytes] = field(default_factory=list)
    grouped: int = 0
    checkable: int = 0  # tasks with a criterion the harnesses decide themselves (no grader model needed)
    model_graded: int = 0  # tasks with a rubric: a grader model decides it (the others' verdict is mechanical)
    skipped: dict[str, str] = field(default_factory=dict)  # conversation id → why
    state: str = "done"  # pending: counts as exported only once acknowledged

    @property
    def tasks(self) -> int:
        return len(self.lines)

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "format": self.format,
            "tasks": self.tasks,
            "grouped": self.grouped,
            "checkable": self.checkable,
            "model_graded": self.model_graded,
            "watermark": self.watermark,
            "skipped": self.skipped,
            "state": self.state,
        }


# What building or writing one task can raise on a conversation Vigil stored: nesting deeper than pydantic
# ("Maximum serialization depth exceeded", a ValueError) or orjson (JSONEncodeError: 255 levels, while
# ingest takes 1024) writes, or than Python recurses. Such a conversation is skipped and reported, like an
# unreadable document, and not recorded as exported; the rest of the run is exported. Any other error of
# these types is a bug, and fails the run (see :func:`_unwritable`).
UNWRITABLE = (orjson.JSONEncodeError, ValueError, RecursionError)


def _unwritable(skipped: dict[str, str], cid: str, exc: BaseException) -> None:
    if isinstance(exc, ValueError) and "depth" not in str(exc):
        raise exc  # not one of the nesting limits: a bug, not a conversation to skip
    skipped[cid] = f"task cannot be written: {exc}"
    log.warning("export skipped %s: its task cannot be written: %s", cid, exc)


def _said(conv: Conversation) -> list[Any]:
    """What of a conversation may state a name as data: its messages (tool calls, results) and metadata."""
    return [conv.metadata, *(m.model_dump(mode="json", exclude_none=True) for m in conv.messages)]


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


def _readable(document: str) -> Conversation | None:
    """The stored conversation, or None when its document cannot be read (the run skips it, counted)."""
    data = reads.read_document(document)
    if data is None:
        return None
    try:
        return Conversation.model_validate(data)
    except ValidationError:
        return None


def _sources(
    session: Session, confirmed: dict[str, str], labels: dict[str, list[Any]], skipped: dict[str, str]
) -> list[Source]:
    ids = sorted(confirmed)
    docs: dict[str, tuple[str, int]] = {}
    findings: dict[str, list[dict[str, Any]]] = defaultdict(list)
    verdicts: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)  # with the revision judged
    for chunk in _chunks(ids):
        for cid, doc, rev in session.execute(
            select(ConversationRow.conversation_id, ConversationRow.document, ConversationRow.revision).where(
                ConversationRow.conversation_id.in_(chunk)
            )
        ):
            docs[cid] = (doc, rev)
        for f in session.scalars(
            select(FindingRow).where(FindingRow.conversation_id.in_(chunk)).order_by(FindingRow.id)
        ):
            findings[f.conversation_id].append(
                {
                    "rule_id": f.rule_id,
                    "rule_type": f.rule_type,
                    "revision": f.revision,
                    "severity": f.severity,
                    "message": f.message,
                    "evidence": f.evidence or [],
                    "details": f.details or {},
                }
            )
        for v in session.scalars(
            select(VerdictRow)
            .where(VerdictRow.conversation_id.in_(chunk), VerdictRow.verdict == "fail")
            .order_by(VerdictRow.id)
        ):
            verdicts[v.conversation_id].append(
                (
                    v.revision,
                    {
                        "judge": v.judge,
                        "judge_version": v.judge_version,
                        "verdict": v.verdict,
                        "categories": v.categories,
                        "rationale": v.rationale,
                    },
                )
            )
    out = []
    for cid in ids:
        if cid not in docs:
            skipped[cid] = "conversation not stored"
            continue
        doc, rev = docs[cid]
        given = _confirmed_revision(labels.get(cid, []))
        if given is not None and rev > given:  # stored since the labels were read: nobody has confirmed it yet
            skipped[cid] = f"revision {rev} was stored after its labels (given on revision {given}): not confirmed"
            continue
        conv = _readable(doc)
        if conv is None:
            skipped[cid] = "stored document cannot be read"
            continue
        confirming = [
            {
                "label": r.label,
                "severity": r.severity,
                "notes": r.notes or "",
                "expected_behavior": r.expected_behavior or "",
            }
            for r in labels.get(cid, [])
            if r.label == "confirmed_failure"
        ]
        # what the task is about is the stored revision: findings and verdicts of an older one judged other text
        out.append(
            Source(
                conv,
                confirmed[cid],
                [f for f in findings[cid] if f["revision"] == rev],
                confirming,
                [v for judged, v in verdicts[cid] if judged == rev],
            )
        )
    return out


def _merged(
    group: list[Source], rules: dict[str, CompiledRule], first_task: dict[str, Any], min_severity: str
) -> dict[str, Any]:
    """The group's task: the first member's conversation (and task id), with every member's reviewer notes
    and expected behaviour (each text once), so folding a near-duplicate loses nothing reviewers wrote."""
    first = group[0]
    labels = [lab for src in group for lab in src.labels]
    task = build(
        Source(first.conversation, first.category, first.findings, labels, first.verdicts), rules, min_severity
    )
    task["task_id"], task["duplicates"] = first_task["task_id"], first_task["duplicates"]
    return task


def _confirmed_revision(rows: list[Any]) -> int | None:
    """The revision a conversation's current labels were given on (None: labels from before revisions)."""
    return max((r.revision for r in rows if r.revision is not None), default=None)


def _exported_before(session: Session, ids: list[str]) -> dict[str, int]:
    """Conversation id → the oldest revision any format exported of it (an index range per chunk)."""
    E = ExportedTaskRow
    out: dict[str, int] = {}
    for chunk in _chunks(sorted(ids)):
        for cid, rev in session.execute(
            select(E.conversation_id, func.min(E.revision))
            .where(E.conversation_id.in_(chunk))
            .group_by(E.conversation_id)
        ):
            out[cid] = rev
    return out


def export(
    session: Session,
    rules: dict[str, CompiledRule],
    redactor: Redactor,
    fmt: str = "native",
    since: int | None = None,
    all_: bool = False,
    actor: str = "cli",
    metrics: Metrics | None = None,
    record: bool = True,
    min_severity: str = "medium",
) -> ExportResult:
    """Build this run's tasks (redacted, rendered in ``fmt``) and record them; the caller commits.

    With ``record=False`` the run is ``pending``: nothing counts as exported until :func:`acknowledge`.
    """
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if since is not None and since < 0:
        raise ExportError("the watermark must be a non-negative integer")
    labels = reads.current_labels(session)
    confirmed = reads.confirmed_failures(session, labels)  # one read: a label saved meanwhile waits
    newest = {cid: max(r.id for r in labels[cid]) for cid in confirmed if labels.get(cid)}
    watermark = max([*newest.values(), since or 0])
    if since is not None:
        confirmed = {cid: cat for cid, cat in confirmed.items() if newest.get(cid, 0) > since}
    E = ExportedTaskRow
    done: dict[str, int] = {}  # conversation id → the newest revision exported in this format
    groups: dict[str, str] = {}
    emitters: dict[str, set[str]] = defaultdict(set)  # group key → conversations whose own task it was
    for cid, key, task_id, rev, is_task in session.execute(
        # in the order recorded: a group's first task names it, whatever order the database returns rows in
        select(E.conversation_id, E.group_key, E.task_id, E.revision, E.emitted).where(E.format == fmt).order_by(E.id)
    ):
        done[cid] = max(rev, done.get(cid, rev))
        groups.setdefault(key, task_id)
        if is_task:
            emitters[key].add(cid)
    if not all_:
        # a newer revision confirmed again is exported again; labels without a revision confirm nothing newer
        confirmed = {
            cid: cat
            for cid, cat in confirmed.items()
            if cid not in done or (_confirmed_revision(labels[cid]) or 0) > done[cid]
        }
        known_groups = groups
    else:
        known_groups = {}
    state = "done" if record else "pending"
    run = ExportRunRow(format=fmt, since=since, watermark=watermark, tasks=0, grouped=0, actor=actor, state=state)
    session.add(run)
    session.flush()
    result = ExportResult(run.id, fmt, watermark, state=state)
    skipped: dict[str, str] = {}
    sources = sorted(
        _sources(session, confirmed, labels, skipped),
        key=lambda s: newest.get(s.conversation.conversation_id, 0),
    )
    first_exported = _exported_before(session, [s.conversation.conversation_id for s in sources])
    emitted: dict[str, dict[str, Any]] = {}
    members: dict[str, list[Source]] = defaultdict(list)
    records = []
    for src in sources:
        cid, rev = src.conversation.conversation_id, src.conversation.effective_revision
        try:
            task = build(src, rules, min_severity)
        except UNWRITABLE as exc:
            _unwritable(skipped, cid, exc)
            continue
        if first_exported.get(cid, rev) < rev:  # replaces a task of an older revision: another id
            task["task_id"] = f"{task['task_id']}-r{rev}"
        if not task["messages"]:  # the failing turn opens the conversation: nothing to replay before it
            skipped[cid] = "no message before the failing turn to replay (the conversation opens with it)"
            log.warning("export skipped %s: %s", cid, skipped[cid])
            continue
        key = task["group_key"]
        if key in emitted:
            emitted[key]["duplicates"].append(cid)
            members[key].append(src)
        # an older revision's own task does not absorb the newer revision: that one replaces it
        known = key in known_groups and cid not in emitters[key]
        if key in emitted or known:
            result.grouped += 1
            task_id = known_groups[key] if known else emitted[key]["task_id"]
            records.append((cid, task_id, key, False, rev))
            continue
        emitted[key] = task
        members[key].append(src)
        records.append((cid, task["task_id"], key, True, rev))
    unwritable: set[str] = set()
    for key, task in emitted.items():
        try:
            if len(members[key]) > 1:
                task = _merged(members[key], rules, task, min_severity)
            stated = redactor.stated_names([_said(src.conversation) for src in members[key]])
            result.lines.append(dumps(render(redact_task(redactor, task, stated), fmt)))
            result.checkable += checkable(task["grading"])
            result.model_graded += model_graded(task["grading"])
        except UNWRITABLE as exc:
            for src in members[key]:
                _unwritable(skipped, src.conversation.conversation_id, exc)
            unwritable.add(key)
            result.grouped -= len(members[key]) - 1
    records = [r for r in records if r[2] not in unwritable]
    fresh = [
        [cid, task_id, key, is_task, rev] for cid, task_id, key, is_task, rev in records if rev > done.get(cid, -1)
    ]
    if record:
        session.add_all(
            ExportedTaskRow(
                format=fmt,
                conversation_id=cid,
                revision=rev,
                task_id=task_id,
                group_key=key,
                run_id=run.id,
                emitted=is_task,
            )
            for cid, task_id, key, is_task, rev in fresh
        )
    elif fresh:
        run.records = fresh
    else:  # nothing this run would record: no download of it can be lost, so nothing waits for a receipt
        run.state = result.state = "done"
        run.acknowledged_at = utcnow()
    run.tasks, run.grouped = result.tasks, result.grouped
    result.skipped = skipped
    session.flush()
    if metrics is not None:
        unreadable = sum(1 for why in skipped.values() if why == "stored document cannot be read")
        if unreadable:
            metrics.unreadable_documents.labels("export").inc(unreadable)
        metrics.export_tasks.labels(fmt).inc(result.tasks)
        metrics.export_grouped.labels(fmt).inc(result.grouped)
        for kind, n in redactor.counts.items():
            metrics.export_redactions.labels(kind).inc(n)
    return result


def acknowledge(session: Session, run_id: int) -> dict[str, Any]:
    """Record a pending run's conversations as exported (the client has its file); the caller commits.

    Idempotent; conversations another run recorded meanwhile stay that run's. Raises ``LookupError``.
    """
    run = session.get(ExportRunRow, run_id, with_for_update=True)
    if run is None:
        raise LookupError(run_id)
    if run.state == "pending":
        rows = [
            {
                "format": run.format,
                "conversation_id": cid,
                "revision": rev,
                "task_id": task_id,
                "group_key": key,
                "run_id": run.id,
                "emitted": bool(is_task),
                "created_at": utcnow(),
            }
            for cid, task_id, key, is_task, rev in run.records or []
        ]
        if rows:
            ins = upsert(session, ExportedTaskRow)
            session.execute(ins.on_conflict_do_nothing(index_elements=["format", "conversation_id", "revision"]), rows)
        run.state, run.records, run.acknowledged_at = "done", None, utcnow()
        session.flush()
    return run_dict(run)


def run_dict(r: ExportRunRow) -> dict[str, Any]:
    return {
        "run_id": r.id,
        "format": r.format,
        "state": r.state,
        "since": r.since,
        "watermark": r.watermark,
        "tasks": r.tasks,
        "grouped": r.grouped,
        "actor": r.actor,
        # in UTC with its offset on every database (SQLite hands back the wall time without one)
        "created_at": aware(r.created_at),
        "acknowledged_at": aware(r.acknowledged_at),
    }
