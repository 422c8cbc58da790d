"""``vigil consume``, ``vigil replay`` and ``vigil simulate``: the command-line ways in."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.progress import Progress

from vigil.errors import VigilError
from vigil.runtime import Launcher


def consume(
    ctx: typer.Context,
    max_idle_polls: Annotated[int | None, typer.Option(help="Exit after this many empty polls.")] = None,
) -> None:
    """Kafka consumer worker: one member of the VIGIL_KAFKA_GROUP_ID consumer group."""
    from vigil.ingest.kafka import ConsumerWorker, dead_letter_producer, kafka_consumer

    launch = Launcher.of(ctx)
    s = launch.settings()
    rt = launch.runtime({"consume"}, s)
    worker = ConsumerWorker(rt, None, None)
    handlers = worker.handlers
    launch.serve_metrics(rt)  # first: a port another worker holds must not make this one join the group and leave
    try:
        worker.consumer = kafka_consumer(rt, list(handlers))
        worker.dlq_producer = dead_letter_producer(rt)
    except VigilError as exc:
        launch.fail(exc)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    signal.signal(signal.SIGINT, lambda *_: worker.stop())
    launch.console.print(f"consuming {', '.join(handlers)} as group {s.kafka_group_id}")
    from vigil.ingest.otlp.finisher import TraceFinisher

    finisher = rt.find(TraceFinisher)  # traced conversations whose root never ends are finished here too
    if finisher is not None:
        finisher.start_thread()
    try:
        worker.run(max_idle_polls=max_idle_polls)
    finally:
        if finisher is not None:
            finisher.stop_thread()


def replay(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Argument(help="Recorded conversation files.", exists=True, dir_okay=False)],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto (detect and say which), openai, openai-responses, anthropic, openai-agents, langsmith, tau2 "
            "or tau-bench.",
        ),
    ] = "auto",
    to_kafka: Annotated[bool, typer.Option("--to-kafka", help="Produce to the conversations topic.")] = False,
    agent_id: Annotated[str | None, typer.Option(help="Override the agent id.")] = None,
    agent_version: Annotated[str | None, typer.Option(help="Override the agent version.")] = None,
    batch: Annotated[int, typer.Option(help="Conversations per stored batch.")] = 200,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read and check the files, say the format of each; store nothing.")
    ] = False,
) -> None:
    """Import recorded conversations in any format Vigil reads into the pipeline (or onto the Kafka topic).

    What can be read is imported; a file, or a JSON line, that cannot be is named (and, when storing, kept as
    a dead letter), and the command then exits 2 with a summary of what was stored and what was refused."""
    launch = Launcher.of(ctx)
    console = launch.console
    from vigil.ingest.importers import FORMATS, MALFORMED, Refused, malformed, read_file_parts

    if format not in ("auto", *FORMATS):
        launch.fail(VigilError(f"--format must be auto, {', '.join(FORMATS)}; not {format!r}"))
    s: Any = None if dry_run else launch.settings()
    producer: Any = None
    rt: Any = None
    if not dry_run and to_kafka:
        if not s.kafka_bootstrap_servers:
            launch.fail(VigilError("--to-kafka needs VIGIL_KAFKA_BOOTSTRAP_SERVERS"))
        producer = _topic_producer(launch, s)
    elif not dry_run:
        rt = launch.runtime({"replay"}, s)
    from vigil.ingest.decode import REASONS, DecodeError, check_times
    from vigil.ingest.http import read_params
    from vigil.schema import latest_allowed
    from vigil.store.writes import DeadLetter

    # a refused file or line is kept as read, in its format: a replay reads it with the options it was read with
    params = read_params(format, agent_id, agent_version)

    def parts(f: Path) -> Iterator[tuple[Any, list[Refused]]]:
        try:  # a large file of JSON lines comes a part at a time (see read_file_parts): memory holds one part
            yield from read_file_parts(f, format, agent_id, agent_version)
        except MALFORMED as exc:  # the importers refuse these themselves; a file is never the cause of a traceback
            yield None, [Refused(f, None, "schema_invalid", str(malformed(f, format, exc)), b"")]

    refused: list[Refused] = []
    how = "detected" if format == "auto" else "as given"
    read = stored = dupes = 0
    with Progress(console=console) as progress:
        task = progress.add_task("importing", total=None)
        for f in files:
            count, first, bad_here = 0, None, []
            for imported, bad in parts(f):
                if rt is not None:  # kept as dead letters as they come; the summary needs only their text
                    letters = [
                        DeadLetter("replay", r.reason, str(r)[:4000], r.raw, params=params)
                        for r in bad
                        if r.reason in REASONS
                    ]
                    if letters:
                        rt.pipeline.store([], letters, "replay")
                    for r in bad:
                        r.raw = b""
                bad_here.extend(bad)
                if imported is None:
                    continue
                first = first or imported
                convs = imported.conversations
                count += len(convs)
                if dry_run:  # what storing would refuse as dated ahead, the decoder's check on each
                    latest = latest_allowed()
                    for c in convs:
                        try:
                            check_times(c, latest)
                        except DecodeError as exc:
                            bad_here.append(
                                Refused(Path(f"conversation {c.conversation_id}"), None, exc.reason, exc.detail, b"")
                            )
                elif producer is not None:
                    for c in convs:
                        producer.send(
                            s.kafka_conversations_topic,
                            key=c.conversation_id.encode(),
                            value=c.model_dump_json(exclude_none=True).encode(),
                        )
                elif rt is not None:
                    for i in range(0, len(convs), batch):
                        result = rt.pipeline.process(convs[i : i + batch], "replay")
                        stored += len(result.stored)
                        dupes += result.duplicates
                        for d in result.dead_letters:  # refused by the decoder or the database: kept as dead letters
                            bad_here.append(Refused(Path(f"conversation {d.key}"), None, d.reason, d.detail, b""))
                progress.advance(task, len(convs))
            if first is not None:
                console.print(f"{escape(str(f))}: {first.format} ({how}: {first.title}), {count} conversations")
            for r in bad_here:
                console.print(f"refused: {r}", markup=False, highlight=False, soft_wrap=True)
            refused.extend(bad_here)
            read += count
    if dry_run:
        _refusals(launch, refused, f"read {read} conversations")
        return
    if producer is not None:
        producer.flush(timeout=120)
        producer.close()
        delivered = producer.acked
        console.print(f"produced {delivered} of {read} conversations to {s.kafka_conversations_topic}")
        if (problem := producer.problem()) is not None:
            launch.fail(VigilError(problem))
        _refusals(launch, refused, f"produced {delivered}")
        return
    console.print(f"{read} conversations: {stored} stored, {dupes} already stored")
    _refusals(launch, refused, f"stored {stored}")


def _refusals(launch: Launcher, refused: list[Any], done: str, shown: int = 20) -> None:
    """With anything refused: one summary line (what was done, then each refusal), and exit 2."""
    if not refused:
        return
    import typer

    parts = [str(r) for r in refused[:shown]]
    if len(refused) > shown:
        parts.append(f"... and {len(refused) - shown} more")
    launch.console.print(
        f"{done}, refused {len(refused)}: " + "; ".join(parts), markup=False, highlight=False, soft_wrap=True
    )
    raise typer.Exit(2)


def simulate(
    ctx: typer.Context,
    count: Annotated[int, typer.Option(min=0, help="Conversations to generate (0 = until stopped).")] = 1000,
    versions: Annotated[str, typer.Option(help="version:failure_rate[:weight],...")] = "v1.4.0:0.04,v1.5.0:0.12",
    agent_id: Annotated[str, typer.Option(help="Agent id.")] = "support-bot",
    seed: Annotated[
        int | None,
        typer.Option(
            help="Random seed (default: a fresh one each run, printed, so a run's conversation ids are its own; "
            "give one to repeat a run)."
        ),
    ] = None,
    rate: Annotated[float, typer.Option(min=0, help="Conversations per second (0 = as fast as possible).")] = 0.0,
    out: Annotated[Path | None, typer.Option(help="Write JSONL here instead of sending.")] = None,
    url: Annotated[str | None, typer.Option(help="POST to this Vigil base URL (e.g. http://127.0.0.1:8000).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="VIGIL_API_KEY", help="Key for --url.")] = None,
    to_kafka: Annotated[bool, typer.Option("--to-kafka", help="Produce to the conversations topic.")] = False,
    outcomes: Annotated[bool, typer.Option(help="Also emit outcome signals.")] = True,
    batch: Annotated[int, typer.Option(min=1, help="Conversations per request/batch.")] = 50,
) -> None:
    """Generate realistic synthetic traffic: several versions, failure rates, tool calls, outcomes."""
    launch = Launcher.of(ctx)
    from vigil.ingest.simulate import Simulator, parse_versions

    try:
        profiles = parse_versions(versions, agent_id)
    except ValueError as exc:
        launch.fail(exc)
    if seed is None:
        # the demo and every earlier run used seed 0: the same conversation ids again, whose outcomes were
        # refused as idempotency conflicts (their times differ) by a Vigil that had stored the first ones
        import secrets

        seed = secrets.randbelow(2**31)
        launch.console.print(f"seed {seed} (--seed {seed} repeats this run)", highlight=False)
    sim = Simulator(profiles, seed)
    sink = _make_sink(launch, out, url, api_key, to_kafka)
    try:
        _run_simulation(launch, sim, sink, count, rate, batch, outcomes)
    except Exception as exc:  # the sink's own failure (unreachable URL, broker) ends the run with a message
        import httpx
        from kafka.errors import KafkaError

        if isinstance(exc, httpx.HTTPError | KafkaError | OSError):
            launch.fail(VigilError(f"sending simulated traffic failed: {exc}"))
        raise


def _run_simulation(launch: Launcher, sim: Any, sink: Any, count: int, rate: float, batch: int, outcomes: bool) -> None:
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
    launch.console.print(f"simulated {sent} conversations")


def _make_sink(  # type: ignore[no-untyped-def]
    launch: Launcher, out: Path | None, url: str | None, api_key: str | None, to_kafka: bool
):
    console = launch.console
    if out is not None:
        fh = out.open("ab")

        def to_file(convs: list[dict[str, Any]], _outs: list[dict[str, Any]]) -> None:
            fh.write(b"".join(orjson.dumps(c) + b"\n" for c in convs))
            fh.flush()

        return to_file
    if url is not None:
        import httpx

        if not api_key:
            launch.fail(VigilError("--url needs an ingest key: --api-key KEY or VIGIL_API_KEY"))
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key or ''}"}, timeout=60)

        def to_http(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
            r = client.post(
                "/v1/conversations", content=orjson.dumps(convs), headers={"content-type": "application/json"}
            )
            if r.status_code >= 400:
                console.print(f"[red]POST /v1/conversations: {r.status_code} {escape(r.text[:300])}[/red]")
                raise typer.Exit(1)
            if outs:
                r = client.post(
                    "/v1/outcomes", content=orjson.dumps(outs), headers={"content-type": "application/json"}
                )
                if r.status_code >= 400 and r.status_code != 404:
                    console.print(f"[yellow]POST /v1/outcomes: {r.status_code} {escape(r.text[:200])}[/yellow]")

        return to_http
    s = launch.settings()
    if to_kafka:
        if not s.kafka_bootstrap_servers:
            launch.fail(VigilError("--to-kafka needs VIGIL_KAFKA_BOOTSTRAP_SERVERS"))
        producer = _topic_producer(launch, s)

        def to_topic(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
            for c in convs:
                producer.send(s.kafka_conversations_topic, key=c["conversation_id"].encode(), value=orjson.dumps(c))
            for o in outs:
                producer.send(s.kafka_outcomes_topic, key=o["conversation_id"].encode(), value=orjson.dumps(o))
            producer.flush(timeout=60)
            if (problem := producer.problem()) is not None:  # stop at the first batch that did not land
                producer.close()
                launch.fail(VigilError(problem))

        return to_topic
    from vigil.schema import Conversation

    rt = launch.runtime({"replay"}, s)

    def to_pipeline(convs: list[dict[str, Any]], outs: list[dict[str, Any]]) -> None:
        rt.pipeline.process([Conversation.model_validate(c) for c in convs], "simulate")
        sink = rt.hooks.outcome_sink
        if sink and outs:
            sink(outs)

    return to_pipeline


def _topic_producer(launch: Launcher, s: Any) -> Any:
    """The ``--to-kafka`` producer; a broker it cannot reach is one line and exit 2, not a traceback."""
    from vigil.ingest.kafka import CountedProducer, settings_producer

    try:
        return CountedProducer(settings_producer(s))
    except VigilError as exc:
        launch.fail(exc)


def register(app: typer.Typer) -> None:
    app.command()(consume)
    app.command()(replay)
    app.command("import")(replay)
    app.command()(simulate)
