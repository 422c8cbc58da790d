"""Builds the parts every role shares from one :class:`Settings`: database, rules, metrics, pipeline."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from . import __version__
from .metrics import Metrics
from .pipeline import DownstreamStage, Pipeline
from .rules import RuleEngine
from .settings import Settings
from .store import db

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    rules: RuleEngine
    metrics: Metrics
    pipeline: Pipeline
    extras: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.engine.dispose()


def load_plugins(settings: Settings) -> None:
    for name in (n.strip() for n in settings.rule_plugins.split(",")):
        if name:
            importlib.import_module(name)


def build_runtime(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    downstream: list[DownstreamStage] | None = None,
    migrate: bool | None = None,
) -> Runtime:
    load_plugins(settings)
    rules = RuleEngine.from_paths(settings.rule_pack_paths())
    url = settings.database_url_str
    if settings.migrate_on_start if migrate is None else migrate:
        db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    metrics = Metrics(registry, settings.max_label_values, settings.label_idle_hours * 3600)
    metrics.build_info.labels(__version__).set(1)
    pipeline = Pipeline(settings, sessions, rules, metrics, downstream or [])
    log.info("loaded %d rules from %s", len(rules.rules), settings.rule_packs)
    return Runtime(settings, engine, sessions, rules, metrics, pipeline)
