"""What the stages of one process share, typed: the runtime, its hooks, and how a stage plugs in.

``vigil.app`` builds one :class:`Runtime` per process and passes it to each stage's ``wire``; a stage
reads the shared objects (settings, database, rules, metrics) and adds itself to the typed
:class:`Hooks`. A stage's own objects are kept by type (:meth:`Runtime.provide`, :meth:`Runtime.get`),
so only the code that can import a class can look its object up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from vigil.errors import ConfigError, VigilError
from vigil.heartbeat import Heartbeat
from vigil.metrics import Metrics
from vigil.rules import RuleEngine
from vigil.schema import HOST_BOUND, Conversation, FutureBound
from vigil.settings import Settings
from vigil.store.erasure import Eraser
from vigil.store.models import OutcomeRow, VerdictRow
from vigil.store.writes import BatchResult, Checked, DeadLetter
from vigil.tables import terminal_safe

if TYPE_CHECKING:  # typer and rich are only needed by the command line
    import typer
    from fastapi import APIRouter
    from rich.console import Console

T = TypeVar("T")

ROLES = frozenset({"serve", "api", "consume", "judge-worker", "detector", "replay"})


@dataclass(slots=True)
class Envelope:
    """One raw message and where it came from (for dead letters)."""

    raw: bytes
    source: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    # refused before its handler read it (reason, detail, size): the handler keeps it as a dead letter with
    # its others, and ``raw`` may hold only its first bytes (the Kafka consumer: a message too large to hand
    # over, a payload in a format Vigil does not read)
    refused: tuple[str, str, int] | None = None


class DownstreamStage(Protocol):
    """A stage fed by stored conversations (sampler, flagger, outcome join). Runs in the batch's transaction."""

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None: ...


class Pipeline(Protocol):
    """Decode, rules, store, downstream stages: what every way in calls (built by ``vigil.ingest``)."""

    stopping: threading.Event  # set on shutdown: a write failing meanwhile is not retried

    def check(self, conversation: Conversation, document: str | None = None) -> Checked: ...

    def process(self, conversations: Sequence[Conversation], source: str) -> BatchResult: ...

    def process_raw(self, envelopes: Sequence[Envelope]) -> BatchResult: ...

    def process_documents(
        self, items: Sequence[tuple[Conversation, str, Envelope | None]], dead: list[DeadLetter], source: str
    ) -> BatchResult: ...

    def store(self, checked: list[Checked], dead: list[DeadLetter], source: str) -> BatchResult: ...


class Background(Protocol):
    """A worker run for the lifetime of ``vigil serve`` (judge worker, detector, demo traffic)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


VerdictListener = Callable[[Session, Sequence[VerdictRow]], None]
OutcomeListener = Callable[[Session, Sequence[OutcomeRow]], None]
ConversationEnricher = Callable[[Session, dict[str, Any]], None]
ResultEnricher = Callable[[Session, Any], None]
TopicHandler = Callable[[Sequence[Envelope]], Any]
OutcomeSink = Callable[[list[dict[str, Any]]], Any]
# (request, target path, unsaved label) -> the page showing it again, or None: a label survives a log-in
LoginResumer = Callable[[Any, str, dict[str, Any]], Any]
# () -> banners every UI page shows while they hold (an active alert): dicts with "text" and "href"
BannerSource = Callable[[], list[dict[str, str]]]
# (a dead letter's raw bytes, the query parameters to read them with: those recorded with it, ?format= of the replay
# over them) -> (HTTP status, answer) as its intake answers it, keeping no new dead letter of a refusal
# (``POST /v1/dead-letters/{id}/replay``); a parameter the intake does not read, or a value it refuses, raises
# BadParameter
Replayer = Callable[[bytes, Mapping[str, str]], tuple[int, dict[str, Any]]]


class BadParameter(VigilError):
    """A query parameter an intake does not read, or a value of it the intake refuses; ``name`` names it."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(why)
        self.name = name


@dataclass
class Hooks:
    """Where stages plug into each other without importing each other.

    - ``downstream``: fed every stored batch inside its transaction (data flows left to right);
    - ``verdict_listeners`` / ``outcome_listeners``: called in the transaction that stores verdicts / outcomes;
    - ``conversation_enrichers``: add a stage's view to ``GET /v1/conversations/{id}``;
    - ``judge_info_enrichers`` / ``compare_enrichers``: add to ``GET /v1/judges`` / ``GET /v1/compare``;
    - ``topic_handlers``: Kafka topic → handler of a batch of envelopes (``vigil consume``);
    - ``background``: workers run inside ``vigil serve``;
    - ``routers``, ``nav`` (``(label, path)``) and ``templates``: a stage's API, UI pages and their folders;
    - ``outcome_sink``: where demo and simulated traffic sends its outcomes;
    - ``login_resumers``: pages that show a label posted with an expired session again after log-in;
    - ``banners``: what every UI page shows on top while it holds (the detector's active alerts);
    - ``replayers``: intake (``conversations``, ``outcomes``) → what re-sends a dead letter's raw bytes through it;
    - ``erasers``: each stage's part of erasing a conversation (its own tables), run in one transaction with
      the shared record's (:mod:`vigil.store.erasure`).
    """

    downstream: list[DownstreamStage] = field(default_factory=list)
    verdict_listeners: list[VerdictListener] = field(default_factory=list)
    outcome_listeners: list[OutcomeListener] = field(default_factory=list)
    conversation_enrichers: list[ConversationEnricher] = field(default_factory=list)
    judge_info_enrichers: list[ResultEnricher] = field(default_factory=list)
    compare_enrichers: list[ResultEnricher] = field(default_factory=list)
    topic_handlers: dict[str, TopicHandler] = field(default_factory=dict)
    background: list[Background] = field(default_factory=list)
    routers: list[APIRouter] = field(default_factory=list)
    nav: list[tuple[str, str]] = field(default_factory=list)
    templates: list[Path] = field(default_factory=list)
    outcome_sink: OutcomeSink | None = None
    login_resumers: list[LoginResumer] = field(default_factory=list)
    banners: list[BannerSource] = field(default_factory=list)
    replayers: dict[str, Replayer] = field(default_factory=dict)
    erasers: list[Eraser] = field(default_factory=list)

    def add_router(self, router: APIRouter) -> None:
        if router not in self.routers:
            self.routers.append(router)

    def add_page(self, label: str, path: str) -> None:
        if (label, path) not in self.nav:
            self.nav.append((label, path))

    def add_templates(self, folder: Path) -> None:
        if folder not in self.templates:
            self.templates.append(folder)


@dataclass(frozen=True, slots=True)
class JudgeInfo:
    """What other stages may know of a configured judge (detector labels, calibration, compare)."""

    name: str
    version: str
    model: str
    offline: bool


@dataclass
class Runtime:
    """The objects one process's stages share, built once by ``vigil.app.runtime.build_runtime``."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    rules: RuleEngine
    metrics: Metrics
    hooks: Hooks
    pipeline: Pipeline
    roles: frozenset[str] = frozenset({"serve"})
    # the latest time an arriving item may carry, on the database's clock (vigil.store.clock): read once a batch
    future_bound: FutureBound = HOST_BOUND
    judges: dict[str, JudgeInfo] = field(default_factory=dict)
    # each long-running loop's, by name ("consumer", "judge", "detector", "trace_finisher", "maintenance",
    # "otlp_grpc"): what /healthz answers from
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    _components: dict[type, object] = field(default_factory=dict, repr=False)

    def provide(self, component: object) -> None:
        """Keep a stage's object for its own routers and commands (one per class)."""
        self._components[type(component)] = component

    def get(self, kind: type[T]) -> T:
        found = self._components.get(kind)
        if found is None:
            raise ConfigError(f"{kind.__name__} is not wired in this process (roles: {', '.join(sorted(self.roles))})")
        return found  # type: ignore[return-value]

    def find(self, kind: type[T]) -> T | None:
        return self._components.get(kind)  # type: ignore[return-value]

    def now(self) -> datetime:
        """Now on the database's clock, without a query (:meth:`vigil.schema.FutureBound.now`): what a time
        written by another replica is compared with when no transaction reads ``now()`` anyway."""
        return self.future_bound.now()

    def heartbeat(self, loop: str) -> Heartbeat:
        """The heartbeat of the loop named ``loop``, made on first ask: from then on ``/healthz`` (the worker's
        metrics port, or the API's in ``vigil serve``) answers 503 while it stalls or once it has ended;
        ``vigil_worker_heartbeat_age_seconds{loop}`` shows its age, ``..._bound_seconds{loop}`` the age past
        which it is stalled and ``vigil_worker_loop_up{loop}`` what ``/healthz`` says of it, a loop stopped as asked
        apart (the VigilLoopStalled alert). One per loop: a loop that beats must not hide another's stall."""
        beat = self.heartbeats.get(loop)
        if beat is None:
            beat = self.heartbeats[loop] = Heartbeat(name=loop)
            stall = self.settings.liveness_stall_seconds
            self.metrics.worker_heartbeat_age.labels(loop).set_function(beat.age)
            self.metrics.worker_heartbeat_bound.labels(loop).set_function(lambda: beat.bound(stall))
            self.metrics.worker_loop_up.labels(loop).set_function(lambda: float(beat.up(stall)))
        return beat

    def has_role(self, *roles: str) -> bool:
        return bool(self.roles & set(roles))

    def close(self) -> None:
        self.engine.dispose()


@dataclass
class Launcher:
    """What a stage's commands need from the command line that runs them (``ctx.obj``, set by ``vigil.app.cli``)."""

    console: Console
    load_settings: Callable[[], Settings]
    build: Callable[[Settings, frozenset[str] | None], Runtime]
    serve_metrics: Callable[[Runtime], None]

    @staticmethod
    def of(ctx: typer.Context) -> Launcher:
        found = ctx.find_object(Launcher)
        if found is None:
            raise RuntimeError("a Vigil command ran outside the vigil command line")
        return found

    def settings(self) -> Settings:
        try:
            return self.load_settings()
        except Exception as exc:  # pydantic names the bad VIGIL_* variable; say it and stop
            self.fail(exc)

    def runtime(self, roles: set[str], settings: Settings | None = None) -> Runtime:
        """A runtime wired with every stage for ``roles``; a configuration error ends the command."""
        return self._build(settings, frozenset(roles))

    def core(self, settings: Settings | None = None) -> Runtime:
        """The shared core only (database, rules, metrics), no stage wired: for commands of one stage."""
        return self._build(settings, None)

    def _build(self, settings: Settings | None, roles: frozenset[str] | None) -> Runtime:
        from vigil.errors import VigilError

        try:
            return self.build(settings or self.settings(), roles)
        except VigilError as exc:
            self.fail(exc)

    def fail(self, exc: Exception | str, code: int = 2) -> NoReturn:
        import typer
        from rich.markup import escape

        # soft_wrap: an error is one line however narrow the terminal (logs and tests read it whole);
        # escape: the message quotes input ("[/x]", a regex's "[a-z]"), which is text, not markup
        self.console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
        raise typer.Exit(code)


@dataclass(frozen=True)
class Stage:
    """One stage as ``vigil.app`` assembles it: its tables, how it wires into a runtime, its commands."""

    name: str
    wire: Callable[[Runtime], object]
    models: ModuleType | None = None
    commands: Callable[[typer.Typer], None] | None = None
