"""A database lease that elects one active detector among any number of replicas."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from vigil.detector.models import DetectorLeaseRow
from vigil.store.db import upsert

NAME = "detector"


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def acquire(session: Session, holder: str, ttl_seconds: float, now: datetime) -> DetectorLeaseRow | None:
    """Take or renew the lease inside the caller's transaction; None if another holder's lease is live.

    The conditional UPDATE locks the row until the transaction ends, so two detectors never fold
    the same range even if a lease expires mid-pass.
    """
    until = now + timedelta(seconds=ttl_seconds)
    ins = upsert(session, DetectorLeaseRow).values(name=NAME, holder=holder, lease_until=now, cursor=None)
    session.execute(ins.on_conflict_do_nothing(index_elements=["name"]))
    result = session.execute(
        update(DetectorLeaseRow)
        .where(
            DetectorLeaseRow.name == NAME,
            or_(DetectorLeaseRow.holder == holder, DetectorLeaseRow.lease_until <= now),
        )
        .values(holder=holder, lease_until=until)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return session.scalars(
        select(DetectorLeaseRow).where(DetectorLeaseRow.name == NAME).execution_options(populate_existing=True)
    ).one()


def release(session: Session, holder: str, now: datetime) -> None:
    session.execute(
        update(DetectorLeaseRow)
        .where(DetectorLeaseRow.name == NAME, DetectorLeaseRow.holder == holder)
        .values(lease_until=now)
    )


def current(session: Session) -> DetectorLeaseRow | None:
    return session.get(DetectorLeaseRow, NAME)
