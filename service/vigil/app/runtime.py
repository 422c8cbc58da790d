"""Builds the parts every role shares from one :class:`Settings`: database, rules, metrics, pipeline."""

from __future__ import annotations

import gc
import importlib
import logging
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from vigil import __version__, observability, rules
from vigil.ingest.pipeline import Pipeline
from vigil.metrics import Metrics
from vigil.rules import RuleEngine
from vigil.runtime import ROLES, Hooks, Runtime
from vigil.settings import Settings
from vigil.store import db
from vigil.store.clock import future_bound

log = logging.getLogger(__name__)


def load_plugins(settings: Settings) -> None:
    rules.load_plugins(settings.rule_plugins)


def build_runtime(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    migrate: bool | None = None,
    roles: Iterable[str] = ("serve",),
) -> Runtime:
    """The shared core of a process, no stage wired yet (:func:`vigil.app.wiring.wire` does that)."""
    load_plugins(settings)
    rules = RuleEngine.from_paths(settings.rule_pack_paths())
    rules.timeout_seconds = settings.rule_timeout_ms / 1000
    rules.max_hits = settings.rule_max_hits
    url = settings.database_url_str
    if settings.migrate_on_start if migrate is None else migrate:
        db.upgrade(url)
    try:
        engine = db.make_engine(url)
    except db.UNREACHABLE as exc:
        raise db.DatabaseUnreachable(url, exc) from exc
    sessions = db.make_sessionmaker(engine)
    metrics = Metrics(registry, settings.max_label_values, settings.label_idle_hours * 3600)
    metrics.build_info.labels(__version__).set(1)
    hooks = Hooks()
    bound = future_bound(engine, sessions, metrics.clock_offset, metrics.clock_offset_age)
    pipeline = Pipeline(settings, sessions, rules, metrics, hooks.downstream, bound)
    observability.configure(settings)
    log.info("loaded %d rules from %s", len(rules.rules), settings.rule_packs)
    unknown = set(roles) - ROLES
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")
    return Runtime(settings, engine, sessions, rules, metrics, hooks, pipeline, frozenset(roles), bound)


# Young collections after this many new container objects instead of Python's 700. A batch of 1,000
# conversations keeps a few hundred thousand objects alive until it is stored; at 700 the collector
# scans them over and over while the batch is built (decode and rules: 14% of their CPU on simulated
# traffic, 21% on tau2 documents). Almost all of it is freed by reference counting, not by the collector,
# and what the collector does free waits for at most this many allocations.
YOUNG_COLLECTION_THRESHOLD = 50_000


# Imported where intervals are computed, not at start (a second and more: see test_cli); a process that
# runs for long imports them before its heap settles, so they are frozen with the rest of start-up instead
# of scanned by every full collection, and its first compare page or detector run does not wait for them.
LONG_RUNNING = frozenset({"serve", "consume", "judge-worker", "detector"})  # "api": one-shot commands too
STATISTICS = ("scipy.stats", "statsmodels.stats.proportion")


def settle_heap(long_running: bool = False) -> None:
    """Called once a process is built: what start-up made (modules, compiled rules and schemas, the ORM's
    mappings) lives as long as the process, so the collector stops scanning it. Full collections then
    cost what the current work allocated, not the whole heap (a fifth of decode and rules CPU before).
    Young collections run less often (:data:`YOUNG_COLLECTION_THRESHOLD`). A ``long_running`` process
    imports the statistics libraries first (see :data:`STATISTICS`)."""
    if long_running:
        for name in STATISTICS:
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
