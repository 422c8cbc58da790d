"""The ``vigil`` command line (Typer)."""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import Progress

from .errors import VigilError
from .settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Vigil: watches LLM agents in production.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
console = Console(stderr=True)


def _settings() -> Settings:
    s = Settings()
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return s


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply Alembic migrations to VIGIL_DATABASE_URL."""
    from .store import db

    s = _settings()
    db.upgrade(s.database_url_str, revision)
    console.print(f"database at {revision}")


@app.command("settings")
def show_settings(
    markdown: Annotated[bool, typer.Option(help="Print the README's settings table instead.")] = False,
) -> None:
    """Print the effective settings (secrets masked), or every setting as a Markdown table."""
    from pydantic import SecretStr

    if markdown:
        print("| variable | default | description |\n|---|---|---|")
        for name, field in Settings.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if isinstance(default, SecretStr):
                default = default.get_secret_value()
            shown = str(default).replace(
                str(Settings.model_fields["judges_dir"].default).rsplit("/", 1)[0], "."
            )
            print(f"| `VIGIL_{name.upper()}` | `{shown}` | {field.description} |")
        return
    s = _settings()
    for name in Settings.model_fields:
        value = getattr(s, name)
        print(
            f"VIGIL_{name.upper()}={'********' if isinstance(value, SecretStr) and value.get_secret_value() else value}"
        )


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (VIGIL_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (VIGIL_PORT).")] = None,
    demo: Annotated[bool, typer.Option(help="Feed simulated traffic into the pipeline in-process.")] = False,
    workers: Annotated[
        bool, typer.Option(help="Also run the judge worker and detector in-process (--no-workers: API and UI only).")
    ] = True,
    demo_rate: Annotated[float, typer.Option(help="Demo conversations per second.")] = 20.0,
    demo_versions: Annotated[str, typer.Option(help="Demo versions as version:failure_rate,...")] = (
        "v1.4.0:0.04,v1.5.0:0.12"
    ),
) -> None:
    """Run the API, /metrics, the reviewer UI and the in-process workers (embedded defaults: SQLite, HTTP)."""
    import uvicorn

    from .server import build_server_app

    s = _settings()
    try:
        application = build_server_app(
            s, demo=demo, demo_rate=demo_rate, demo_versions=demo_versions, workers=workers
        )
    except VigilError as exc:
        _fail(exc)
    uvicorn.run(application, host=host or s.host, port=port or s.port, log_level=s.log_level.lower())


@app.command()
def consume(
    max_idle_polls: Annotated[int | None, typer.Option(help="Exit after this many empty polls.")] = None,
) -> None:
    """Kafka consumer worker: one member of the VIGIL_KAFKA_GROUP_ID consumer group."""
    from .consumer import ConsumerWorker, kafka_consumer, kafka_producer
    from .runtime import build_runtime
    from .server import consumer_handlers, start_metrics_server

    s = _settings()
    try:
        from .wiring import wire

        rt = wire(build_runtime(s), {"consume"})
        handlers = consumer_handlers(rt)
        consumer = kafka_consumer(rt, list(handlers))
    except VigilError as exc:
        _fail(exc)
    start_metrics_server(rt)
    dlq = kafka_producer(s.kafka_bootstrap_servers) if s.kafka_dead_letter_topic else None
    worker = ConsumerWorker(rt, consumer, None, dlq)
    worker.handlers.update(handlers)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    signal.signal(signal.SIGINT, lambda *_: worker.stop())
    console.print(f"consuming {', '.join(handlers)} as group {s.kafka_group_id}")
    worker.run(max_idle_polls=max_idle_polls)


@app.command()
def replay(
    files: Annotated[
        list[Path], typer.Argument(help="Recorded conversation files.", exists=True, dir_okay=False)
    ],
    format: Annotated[str, typer.Option("--format", help="auto, openai, tau2 or tau-bench.")] = "auto",
    to_kafka: Annotated[bool, typer.Option("--to-kafka", help="Produce to the conversations topic.")] = False,
    agent_id: Annotated[str | None, typer.Option(help="Override the agent id.")] = None,
    agent_version: Annotated[str | None, typer.Option(help="Override the agent version.")] = None,
    batch: Annotated[int, typer.Option(help="Conversations per stored batch.")] = 200,
) -> None:
    """Push recorded conversations through the pipeline (or onto the Kafka topic)."""
    from .importers import ImportError_, load_file

    if format not in ("auto", "openai", "tau2", "tau-bench"):
        _fail(VigilError(f"--format must be auto, openai, tau2 or tau-bench, not {format!r}"))
    s = _settings()
    convs: list[Any] = []
    try:
        for f in files:
            convs.extend(load_file(f, format, agent_id, agent_version))  # type: ignore[arg-type]
    except ImportError_ as exc:
        _fail(exc)
    stored = dupes = 0
    with Progress(console=console) as progress:
        task = progress.add_task("replaying", total=len(convs))
        if to_kafka:
            from .consumer import kafka_producer

            if not s.kafka_bootstrap_servers:
                _fail(VigilError("--to-kafka needs VIGIL_KAFKA_BOOTSTRAP_SERVERS"))
            producer = kafka_producer(s.kafka_bootstrap_servers)
            for c in convs:
                producer.send(
                    s.kafka_conversations_topic,
                    key=c.conversation_id.encode(),
                    value=c.model_dump_json(exclude_none=True).encode(),
                )
                progress.advance(task)
            producer.flush(timeout=120)
            producer.close()
            console.print(f"produced {len(convs)} conversations to {s.kafka_conversations_topic}")
            return
        from .runtime import build_runtime
        from .wiring import wire

        rt = wire(build_runtime(s), {"replay"})
        for i in range(0, len(convs), batch):
            chunk = convs[i : i + batch]
            result = rt.pipeline.process(chunk, "replay")
            stored += len(result.stored)
            dupes += result.duplicates
            progress.advance(task, len(chunk))
    console.print(f"{len(convs)} conversations: {stored} stored, {dupes} already stored")


@app.command()
def simulate(
    count: Annotated[int, typer.Option(help="Conversations to generate (0 = until stopped).")] = 1000,
    versions: Annotated[
        str, typer.Option(help="version:failure_rate[:weight],...")
    ] = "v1.4.0:0.04,v1.5.0:0.12",
    agent_id: Annotated[str, typer.Option(help="Agent id.")] = "support-bot",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    rate: Annotated[float, typer.Option(help="Conversations per second (0 = as fast as possible).")] = 0.0,
    out: Annotated[Path | None, typer.Option(help="Write JSONL here instead of sending.")] = None,
    url: Annotated[
        str | None, typer.Option(help="POST to this Vigil base URL (e.g. http://127.0.0.1:8000).")
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar="VIGIL_API_KEY", help="Key for --url.")] = None,
    to_kafka: Annotated[bool, typer.Option("--to-kafka", help="Produce to the conversations topic.")] = False,
    outcomes: Annotated[bool, typer.Option(help="Also emit outcome signals.")] = True,
    batch: Annotated[int, typer.Option(help="Conversations per request/batch.")] = 50,
) -> None:
    """Generate realistic synthetic traffic: several versions, failure rates, tool calls, outcomes."""
    from .simulate import Simulator, parse_versions

    try:
        profiles = parse_versions(versions, agent_id)
    except ValueError as exc:
        _fail(exc)
    sim = Simulator(profiles, seed)
    sink = _make_sink(out, url, api_key, to_kafka)
    try:
        _run_simulation(sim, sink, count, rate, batch, outcomes)
    except Exception as exc:  # the sink's own failure (unreachable URL, broker) ends the run with a message
        import httpx
        from kafka.errors import KafkaError

        if isinstance(exc, httpx.HTTPError | KafkaError | OSError):
            _fail(VigilError(f"sending simulated traffic failed: {exc}"))
        raise


def _run_simulation(sim: Any, sink: Any, count: int, rate: float, batch: int, outcomes: bool) -> None:
    sent = 0
    t0 = time.monotonic()
    buf: list[dict[str, Any]] = []
    outs: list[dict[str, Any]] = []
    for conv in sim.stream(count or None):
        buf.append(conv)
        if outcomes:
            outs.extend(sim.outcomes_for(conv))
        if len(buf) >= batch:
            sink(buf, outs)
            sent += len(buf)
            buf, outs = [], []
            if rate:
                ahead = sent / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
    if buf:
        sink(buf, outs)
        sent += len(buf)
    console.print(f"simulated {sent} conversations")


def _make_sink(out: Path | None, url: str | None, api_key: str | None, to_kafka: bool):  # type: ignore[no-untyped-def]
    if out is not None:
        fh = out.open("ab")

        def to_file(convs: list[dict[str, Any]], _outs: list[dict[str, Any]]) -> None:
            fh.write(b"".join(orjson.dumps(c) + b"\n" for c in convs))
            fh.flush()

        return to_file
    if url is not None:
        import httpx

        if not api_key:
            _fail(VigilError("--url needs an ingest key: --api-key KEY or VIGIL_API_KEY"))
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key or ''}"}, timeout=60)

        def to_http(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
            r = client.post(
                "/v1/conversations", content=orjson.dumps(convs), headers={"content-type": "application/json"}
            )
            if r.status_code >= 400:
                console.print(f"[red]POST /v1/conversations: {r.status_code} {r.text[:300]}[/red]")
                raise typer.Exit(1)
            if outs:
                r = client.post(
                    "/v1/outcomes", content=orjson.dumps(outs), headers={"content-type": "application/json"}
                )
                if r.status_code >= 400 and r.status_code != 404:
                    console.print(f"[yellow]POST /v1/outcomes: {r.status_code} {r.text[:200]}[/yellow]")

        return to_http
    s = _settings()
    if to_kafka:
        from .consumer import kafka_producer

        if not s.kafka_bootstrap_servers:
            _fail(VigilError("--to-kafka needs VIGIL_KAFKA_BOOTSTRAP_SERVERS"))
        producer = kafka_producer(s.kafka_bootstrap_servers)

        def to_topic(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
            for c in convs:
                producer.send(
                    s.kafka_conversations_topic, key=c["conversation_id"].encode(), value=orjson.dumps(c)
                )
            for o in outs:
                producer.send(
                    s.kafka_outcomes_topic, key=o["conversation_id"].encode(), value=orjson.dumps(o)
                )
            producer.flush(timeout=60)

        return to_topic
    from .runtime import build_runtime
    from .schema import Conversation
    from .wiring import wire

    rt = wire(build_runtime(s), {"replay"})

    def to_pipeline(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
        rt.pipeline.process([Conversation.model_validate(c) for c in convs], "simulate")
        sink = rt.extras.get("outcome_sink")
        if sink and outs:
            sink(outs)

    return to_pipeline


def _register_stage_commands() -> None:
    """Stages add their commands in ``service/<stage>/commands.py`` with ``register(app)``."""
    import importlib

    for path in STAGE_COMMANDS:
        importlib.import_module(path).register(app)


STAGE_COMMANDS: list[str] = [
    "service.review.commands",
    "service.judge.commands",
    "service.compare.commands",
    "service.detector.commands",
    "service.calibration.commands",
]
_register_stage_commands()


def main() -> None:
    try:
        app()
    except VigilError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
