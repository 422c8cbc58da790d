"""One settings object, read from ``VIGIL_*`` environment variables, built once at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _project_root() -> Path:
    """The checkout Vigil runs from; installed elsewhere (the image's /app), the working directory."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "pyproject.toml").is_file() and (checkout / "rules").is_dir() else Path.cwd()


PROJECT_ROOT = _project_root()

Role = Literal["ingest", "reviewer", "admin"]


class ApiKey:
    __slots__ = ("name", "role", "key")

    def __init__(self, name: str, role: str, key: SecretStr) -> None:
        self.name, self.role, self.key = name, role, key

    def __repr__(self) -> str:
        return f"ApiKey(name={self.name!r}, role={self.role!r})"


def _default_dir(name: str) -> str:
    return str(PROJECT_ROOT / name)


class Settings(BaseSettings):
    """All of Vigil's configuration. Each field is documented in the README (a test checks)."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_", extra="ignore")

    database_url: SecretStr = Field(
        default=SecretStr("sqlite:///vigil.db"),
        description=(
            "SQLAlchemy URL. SQLite file by default; postgresql+psycopg://... for Postgres (connection timeouts and "
            "keepalives: see [Kafka and Postgres](kafka-and-postgres.md); the URL's query, `PGCONNECT_TIMEOUT` or a "
            "named connection service override them)."
        ),
    )
    api_keys: SecretStr = Field(
        default=SecretStr(""),
        description="Comma-separated name:role:key entries; roles are ingest, reviewer, admin.",
    )
    rule_packs: str = Field(
        default=_default_dir("rules") + "/*.yaml",
        description="Comma-separated paths or globs of rule pack YAML files (each pack scopes itself by agent).",
    )
    rule_plugins: str = Field(
        default="", description="Comma-separated Python modules imported at start-up to register rule types."
    )
    judges_dir: str = Field(default=_default_dir("judges"), description="Folder of judge definitions.")
    kafka_bootstrap_servers: str = Field(default="", description="Kafka bootstrap servers, host:port,...")
    kafka_conversations_topic: str = Field(default="conversations", description="Topic of conversations.")
    kafka_outcomes_topic: str = Field(default="outcomes", description="Topic of outcome signals.")
    kafka_group_id: str = Field(default="vigil", description="Consumer group id of `vigil consume`.")
    kafka_dead_letter_topic: str = Field(
        default="", description="If set, bad messages are also produced to this topic."
    )
    kafka_batch_size: int = Field(default=500, ge=1, description="Max records per poll/commit batch.")
    kafka_poll_timeout_ms: int = Field(default=500, ge=1, description="Poll timeout of the consumer.")
    kafka_max_poll_interval_ms: int = Field(
        default=300_000, ge=1000, description="Consumer max_poll_interval_ms (rebalance timeout)."
    )
    kafka_session_timeout_ms: int = Field(default=10_000, ge=1000, description="Consumer session timeout.")
    kafka_request_timeout_ms: int = Field(
        default=15_000,
        ge=1000,
        description="How long the Kafka client waits for a broker's answer before it drops the connection. A "
        "broker that accepts connections and stops answering makes the client spin (a CPU and a growing heap) "
        "until then: at 30 s a consumer grew by 430 MB, at 15 s by 160 MB.",
    )
    kafka_metadata_max_age_ms: int = Field(
        default=30_000,
        ge=1000,
        description="How often a consumer refreshes topic metadata, so partitions added to a topic are assigned "
        "by a rebalance within about this long (the client's own default is 5 minutes).",
    )
    kafka_bootstrap_timeout_ms: int = Field(
        default=30_000, ge=100, description="How long `vigil consume` tries to reach the brokers before it exits 2."
    )
    kafka_isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        default="read_committed",
        description="What the consumer reads of transactional producers' messages: `read_committed`, only "
        "those of committed transactions (it waits for an open transaction to end; a broker that reports "
        "aborted transactions has their messages skipped); `read_uncommitted`, every message as written, "
        "those of transactions still open or later aborted too. No effect on other producers' messages.",
    )
    kafka_max_inflated_batch_bytes: int = Field(
        default=67_108_864,
        ge=1_048_576,
        description="Largest a compressed record batch may inflate to when the consumer reads it; one that "
        "inflates further is inflated no further and kept as an `oversized_batch` dead letter (its compressed "
        "bytes). kafka-python inflated batches whole: a zstd batch of 32 KB inflating to 1 GiB took a consumer "
        "from 234 MB to 3.4 GB.",
    )
    max_message_bytes: int = Field(
        default=1_000_000,
        ge=1024,
        description="Conversations larger than this are dead-lettered (`oversized`); so is any larger message "
        "on a Kafka topic, conversations or outcomes, as it leaves its batch.",
    )
    dead_letter_raw_bytes: int = Field(
        default=16_384,
        ge=0,
        description="How much of a bad message's raw bytes is kept; an HTTP request's invalid items share one "
        "dead letter per reason, and so do a consumer batch's bad messages per partition and reason.",
    )
    dead_letter_batch_raw_bytes: int = Field(
        default=65_536,
        ge=0,
        description="Raw bytes kept from one request or consumer batch across all its dead letters; past it a "
        "letter keeps its reason, positions, size and errors but no raw bytes (a Kafka dead-letter topic, "
        "if set, still receives every bad message whole).",
    )
    max_request_bytes: int = Field(
        default=33_554_432,
        ge=1024,
        description="Largest request body in bytes, on every endpoint (conversations, outcomes and OTLP traces "
        "also keep a dead letter of what they refuse); refused with 413 while reading, before it is buffered "
        "(default 32 MiB: a batch of 1,000 conversations of 32 KB).",
    )
    max_json_expansion: float = Field(
        default=8.0,
        ge=0,
        description="A JSON body (conversations, outcomes, OTLP/JSON) of 64 KiB or more whose objects, arrays "
        "and items would take more than this many times its size in memory once decoded (estimated before "
        "decoding, 96 bytes per object or array and 24 per item; commas and brackets inside strings do not count) "
        "is refused with 413 and kept as a dead letter, as is such a message on the conversations or outcomes topic "
        "(reason `oversized`); real conversation batches estimate at about 1. 0: no bound.",
    )
    max_inflight_bytes: int = Field(
        default=67_108_864,
        ge=1024,
        description="Request body bytes an API process holds at once across all requests, counted as they "
        "arrive, not by their declared length (bounds memory under concurrent large batches); a body needing "
        "more waits its turn, and when the bodies still arriving together need more than this, the youngest "
        "is answered 503 with Retry-After. A body being decoded, converted and stored holds what its objects "
        "take, at most all of this: 21 times its size for /v1/conversations, 22 for /v1/outcomes, 17 and 18 "
        "for OTLP/JSON spans and log records, 4 and 12 for protobuf ones; it waits while other decoding "
        "bodies hold what it needs: the process holds about twice this at most.",
    )
    key_concurrency: int = Field(
        default=8,
        ge=0,
        description="Requests of one API key (or of a UI session, by its key) an API process runs at once, "
        "ingest endpoints excepted (VIGIL_MAX_INFLIGHT_BYTES bounds those); up to 8 times as many more wait "
        "their turn and further ones are answered 429, so one key cannot take every worker thread. 0: no bound.",
    )
    store_retry_attempts: int = Field(
        default=5,
        ge=1,
        description="Tries of a write that hits a deadlock, serialization failure or lost connection before "
        "it fails (HTTP answers 503, Kafka keeps the batch uncommitted and tries again).",
    )
    store_retry_base_seconds: float = Field(
        default=0.05, gt=0, description="First backoff of a retried write; doubles per try, with full jitter."
    )
    store_retry_after_seconds: float = Field(
        default=2.0, gt=0, description="Retry-After of a 503 answered when a request could not be stored."
    )
    rule_timeout_ms: float = Field(
        default=1000.0,
        gt=0,
        description="Time budget of one rule on one conversation; a rule over it yields an info rule_timeout "
        "finding (not a failure of the agent) and counts in vigil_rule_timeouts_total.",
    )
    rule_max_hits: int = Field(
        default=50,
        ge=1,
        description="Findings one rule stores per conversation; past it the last stored finding counts the hits "
        "left out (details.hits_not_stored), so a hostile conversation cannot turn into thousands of rows.",
    )
    max_label_values: int = Field(
        default=50, ge=1, description="Distinct agents/versions per metric label before folding to 'other'."
    )
    label_idle_hours: float = Field(
        default=24.0,
        ge=0,
        description="An agent or version unseen this long frees its place in the label budget (0 = never).",
    )
    host: str = Field(default="127.0.0.1", description="Bind address of `vigil serve`.")
    port: int = Field(default=8000, description="Port of `vigil serve`.")
    metrics_host: str = Field(default="0.0.0.0", description="Bind address of a worker's /metrics server.")
    metrics_port: int = Field(
        default=9108, ge=0, description="Port of /metrics for `vigil consume` and workers (0 = off)."
    )
    liveness_stall_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A worker (`vigil consume`, `vigil judge-worker`, `vigil detector`) answers 503 on `/healthz` "
        "of its metrics port, and its liveness probe restarts it, once its loop has finished no iteration for this "
        "long beyond its own wait between passes, or has ended; `vigil serve` answers so on its API's `/healthz` "
        "for the loops it runs in-process (judge worker, detector, idle-trace finisher, rollup and retention "
        "upkeep, OTLP/gRPC receiver), naming each such loop. Long work beats as it goes (each hour a detector "
        "pass folds, each retry of a batch the database refused, each statement of a rollup rebuild or retention "
        "run; judge calls run beside the loop), so this bounds one step: a consumer's batch, which Kafka itself "
        "bounds by VIGIL_KAFKA_MAX_POLL_INTERVAL_MS.",
    )
    log_level: str = Field(default="INFO", description="Log level.")
    migrate_on_start: bool = Field(default=True, description="Run Alembic migrations when a role starts.")

    # --- judge (issue: LLM judge) ---
    judge_enabled: bool = Field(
        default=True,
        description="Load judges from VIGIL_JUDGES_DIR; false turns sampling and the worker off.",
    )
    judge_mode: Literal["auto", "live", "offline"] = Field(
        default="auto",
        description="live calls the model; offline uses the deterministic offline judge; auto is offline for "
        "a judge whose model has no provider key in the environment.",
    )
    judge_concurrency: int = Field(
        default=64, ge=1, description="Model calls in flight per judge worker process (all judges together)."
    )
    judge_poll_interval_seconds: float = Field(
        default=0.5, gt=0, description="How often an idle judge worker looks for due requests."
    )
    judge_lease_seconds: float = Field(
        default=300.0, ge=5, description="A claimed request returns to the queue if not finished by then."
    )
    judge_max_attempts: int = Field(
        default=6,
        ge=1,
        description="Attempts of a request on retryable errors before it gets an unscored verdict (gave_up).",
    )
    judge_reasks: int = Field(
        default=1,
        ge=0,
        le=5,
        description="Times a judge's request is sent again, within one attempt, when the reply cannot be read "
        "(not the JSON verdict object, or a body the client cannot read); then the verdict is unscored.",
    )
    judge_retry_base_seconds: float = Field(
        default=2.0,
        gt=0,
        description="First retry delay; doubles per attempt, with equal jitter (half fixed, half random).",
    )
    judge_retry_max_seconds: float = Field(default=300.0, gt=0, description="Longest retry delay.")
    judge_circuit_failures: int = Field(
        default=3,
        ge=1,
        description="Consecutive retryable failures of a judge's model that open its circuit (after the first, "
        "calls go one at a time, so an outage costs about this many calls).",
    )
    judge_circuit_cooldown_seconds: float = Field(
        default=30.0, gt=0, description="How long an open circuit waits before one probe call."
    )
    judge_default_daily_budget_usd: float = Field(
        default=5.0, ge=0, description="Daily spend cap (UTC day) of a judge whose judge.yaml sets none."
    )
    judge_min_versions: int = Field(
        default=50,
        ge=0,
        description="Agent versions per judge that get a judge.yaml's min_per_agent_version_per_hour each hour: "
        "versions within the agent_version label budget (VIGIL_MAX_LABEL_VALUES), the first this many to "
        "arrive in the hour; any other version is judged at the sample rate alone.",
    )
    judge_min_per_hour_cap: int = Field(
        default=250,
        ge=0,
        description="At most this many requests per judge per hour come from the per-version minimum, "
        "whatever the number of versions (the sample rate and always-judge rules are not capped by it).",
    )
    judge_context_files: str = Field(
        default="",
        description="name=path,... files a judge's prompt can include as {{context.NAME}} (e.g. a policy).",
    )
    # --- end judge ---

    # --- review (issue: review queue and UI) ---
    review_policy: str = Field(
        default="",
        description="Flagging policy YAML (what enters the review queue, priorities, sampling, taxonomy); "
        "empty = the built-in service/vigil/review/flagging.yaml.",
    )
    review_lease_seconds: int = Field(
        default=600,
        ge=10,
        description="How long a claimed review item stays with its reviewer unless extended.",
    )
    review_assignment_hours: float = Field(
        default=72.0,
        ge=0,
        description="How long an item assigned to a reviewer is kept for them: after this many hours without "
        "their label, claim-next offers it to everyone again (0 = assignments never lapse).",
    )
    review_assignment_timeout_hours: float = Field(
        default=336.0,
        ge=0,
        description="An assignment whose reviewer did nothing on the item (no claim, comment, skip, label...) for "
        "this many hours is released by the retention job, with an 'assignment_timeout' audit event: the item is "
        "anyone's again and can leave the queue after VIGIL_RETENTION_OPEN_REVIEW_DAYS (0 = assignments are kept "
        "until unassigned). 14 days: past a holiday, and well inside the open-review retention.",
    )
    review_session_secret: SecretStr = Field(
        default=SecretStr(""),
        description="Key that signs reviewer UI session cookies; empty = random per process "
        "(set it when several API replicas serve the UI).",
    )
    review_session_max_age_seconds: int = Field(
        default=43_200, ge=60, description="Reviewer UI sessions expire after this many seconds."
    )
    review_cookie_secure: bool = Field(
        default=False, description="Mark the UI session cookie Secure (set true behind HTTPS)."
    )
    auth_proxy_user_header: str = Field(
        default="",
        description="Single sign-on through an authenticating proxy (oauth2-proxy, an ingress's external "
        "authentication): the request header in which the proxy names the signed-in user, e.g. "
        "X-Forwarded-Email. Empty = off. Honoured only from VIGIL_AUTH_PROXY_TRUSTED_NETWORKS (required "
        "with it); see [Console](console.md#single-sign-on-through-a-proxy).",
    )
    auth_proxy_groups_header: str = Field(
        default="",
        description="The header in which the proxy lists the user's groups, comma-separated, e.g. "
        "X-Forwarded-Groups; read with VIGIL_AUTH_PROXY_ROLES.",
    )
    auth_proxy_roles: str = Field(
        default="",
        description='Groups to console roles as JSON, e.g. {"vigil-admins": "admin", "support-qa": "reviewer"}; '
        "a user gets the highest role of their groups.",
    )
    auth_proxy_default_role: str = Field(
        default="",
        description="Role of a signed-in user none of whose groups is mapped: reviewer, admin, or empty "
        "(refused with 403).",
    )
    auth_proxy_trusted_networks: str = Field(
        default="",
        description="Comma-separated addresses or networks (CIDR) the proxy connects from, checked against the "
        "connection's own peer address (never X-Forwarded-For); for a sidecar 127.0.0.1/32.",
    )
    auth_proxy_logout_url: str = Field(
        default="",
        description="Where Log out sends a user signed in through the proxy (e.g. /oauth2/sign_out); empty: "
        "the log-in page.",
    )
    # --- end review ---

    # --- outcomes, compare, detector (issue: outcomes and alerting) ---
    outcome_types: str = Field(
        default="",
        description="Custom outcome types as name:kind,... where kind is bad (higher is worse), good or score.",
    )
    outcome_attribution_window_hours: float = Field(
        default=168.0,
        gt=0,
        description="An outcome counts toward its conversation's version only if it occurs within this many "
        "hours after the conversation ended.",
    )
    compare_outcome_settle_hours: float = Field(
        default=6.0,
        ge=0,
        le=8760,
        description="Outcome rates in compare and quality count only conversations received at least this many "
        "hours ago (whole hours, at most a year), on both sides: outcomes arrive after their conversation, and a "
        "version whose outcomes are not in yet would otherwise read as having none. Task success counts graded "
        "trials instead where both versions' conversations are trials of tasks; means of score outcomes count "
        "every reported score. 0 counts every conversation.",
    )
    compare_max_sample: int = Field(
        default=5_000,
        ge=100,
        description="Most recent conversations per version used for intervals of means and p95 latency (the p95 "
        "bootstrap's cost grows with this times the resamples; rates come from the rollups and are not sampled).",
    )
    compare_metadata_sample: int = Field(
        default=500,
        ge=10,
        description="Most recent conversations per version whose metadata compare reads: the error and truncation "
        "rates and how each version was run (model, sampling, harness, tools, grader, budgets).",
    )
    compare_bootstrap_resamples: int = Field(
        default=200,
        ge=100,
        description="Bootstrap resamples for the interval of p95 latency (means use Welch's closed-form interval).",
    )
    detector_interval_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How often the detector folds newly stored conversations into its state.",
    )
    detector_settle_seconds: float = Field(
        default=30.0,
        ge=0,
        description="The detector reads conversations received at least this long ago (lets in-flight "
        "transactions land first).",
    )
    detector_outcome_settle_hours: float = Field(
        default=6.0,
        ge=0,
        le=8760,
        description="Outcome signals of an hour's conversations reach the detector this many hours after the "
        "hour, counting the outcomes joined by then; later ones show in `vigil compare` only.",
    )
    detector_lease_seconds: float = Field(
        default=60.0, gt=0, description="Lease that elects the one active detector; renewed every tick."
    )
    detector_arl0: float = Field(
        default=200_000.0,
        gt=10,
        description="Guaranteed minimum of conversations between false alarms per signal; the CUSUM threshold "
        "is log(ARL0 x number of shifts).",
    )
    detector_shifts: str = Field(
        default="1.5,2.0",
        description="Relative rises of a failure rate the CUSUMs are tuned to detect (comma-separated ratios).",
    )
    detector_min_abs_shift: float = Field(
        default=0.005,
        gt=0,
        description="Smallest absolute rise of a rate the detector is tuned to (rare signals).",
    )
    detector_min_baseline: int = Field(
        default=500, ge=10, description="Conversations the baseline needs before a version is monitored."
    )
    detector_baseline_confidence: float = Field(
        default=0.9,
        ge=0.5,
        lt=1.0,
        description="The baseline rate used is the upper bound of its one-sided interval at this confidence, "
        "so a noisy baseline does not cause false alarms.",
    )
    detector_self_baseline_hours: float = Field(
        default=24.0,
        gt=0,
        description="A version without a previous version is compared with its own traffic older than this.",
    )
    detector_retire_hours: float = Field(
        default=24.0,
        gt=0,
        description="A version without traffic for this long is no longer exported and its detections close.",
    )
    # --- end outcomes ---

    # --- calibration and export ---
    calibration_min_labels: int = Field(
        default=50,
        ge=1,
        description="Scored human labels a judge version needs before it can count as calibrated.",
    )
    calibration_min_kappa: float = Field(
        default=0.6,
        ge=-1,
        le=1,
        description="Cohen's kappa with human labels a judge version needs to count as calibrated.",
    )
    calibration_correction_labels: Literal["sampled", "all"] = Field(
        default="sampled",
        description="Which review-queue labels measure a judge's error rates for corrected failure rates: "
        "sampled = only items the review policy drew at random (unbiased); all = every labelled item.",
    )
    calibration_max_pairs: int = Field(
        default=5_000,
        ge=1,
        description="Review-queue calibration of a judge reads the conversations of its newest this many current "
        "labels (by label id) only, so its cost stays flat as labels accumulate; older labels no longer count "
        "toward its agreement, state or corrected rates.",
    )
    export_min_criterion_severity: Literal["info", "low", "medium", "high", "critical"] = Field(
        default="medium",
        description="Only rule findings at or above this severity become an exported task's grading criteria "
        "(an info-level hand-off to a human never becomes must_not_escalate).",
    )
    export_redact_patterns: dict[str, str] = Field(
        default_factory=dict,
        description="Extra patterns redacted on export besides the built-in PII and secret detector, as JSON "
        '{"name": "regex", ...} (RE2 syntax); a match becomes [REDACTED:name].',
    )
    export_redact_names: bool = Field(
        default=True,
        description="Redact the personal names a conversation states as data (values of first_name, last_name, "
        "full_name, user_name... and of name inside a user, customer or passenger record, in its tool calls and "
        "results) wherever they occur in its exported task, whole and each part; a match becomes "
        "[REDACTED:name].",
    )
    export_redact_name_keys: list[str] = Field(
        default_factory=list,
        description="More JSON keys whose string values are personal names, besides the built-in ones, as a JSON "
        'list (["agent_name", "nickname"]); compared lowercased without separators (nickName is nickname).',
    )
    # --- end calibration ---

    # --- tracing and OTLP ingest ---
    tracing_enabled: bool = Field(
        default=False,
        description="Trace Vigil's own pipeline with OpenTelemetry (also on when OTEL_EXPORTER_OTLP_ENDPOINT "
        "or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set); exported by the standard OTEL_* variables.",
    )
    otlp_ingest_enabled: bool = Field(
        default=True, description="Accept agent traces at POST /v1/traces (OTLP/HTTP, protobuf or JSON)."
    )
    otlp_max_body_bytes: int = Field(
        default=16_000_000, ge=1024, description="Largest accepted OTLP request body (after decompression)."
    )
    otlp_max_spans_per_request: int = Field(
        default=50_000,
        ge=1,
        description="Most spans (or log records) one OTLP request may carry; a larger request is refused whole "
        "(413, or INVALID_ARGUMENT over gRPC) before its spans are decoded. SDKs send batches of 512, "
        "collectors a few thousand.",
    )
    otlp_max_spans_per_conversation: int = Field(
        default=5000, ge=1, description="Spans kept per assembled conversation; later spans are dropped."
    )
    otlp_span_retention_hours: float = Field(
        default=72.0, gt=0, description="Buffered OTLP spans older than this are deleted."
    )
    otlp_default_agent_version: str = Field(
        default="unknown",
        description="Agent version of a traced conversation without gen_ai.agent.version or service.version.",
    )
    otlp_trace_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A traced conversation nothing was added to for this long is finished (rules, sampling and "
        "judgement run on it) even if its root span never arrived. When it last grew is kept to within a tenth "
        "of this.",
    )
    otlp_progress_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description="An unfinished traced conversation goes through the pipeline (rules, store) at most once in "
        "this many seconds as spans arrive; its finished revision always does. 0: on every request.",
    )
    otlp_finish_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often serve and consume look for idle traced conversations to finish."
    )
    otlp_finish_lease_seconds: float = Field(
        default=120.0,
        gt=0,
        description="How long a replica's claim on an idle conversation it is finishing lasts (another replica "
        "takes over after a crash).",
    )
    otlp_grpc_port: int = Field(
        default=4317,
        ge=0,
        description="Port of the OTLP/gRPC receiver (traces and logs) run by serve and api, bound to VIGIL_HOST; "
        "0 turns it off.",
    )
    # --- end tracing ---

    # --- scale: rollups, read windows, list counts, retention ---
    read_window_days: float = Field(
        default=7.0,
        ge=0,
        description="Compare, quality and the queue's aggregate reads cover the last this many days unless the "
        "request says since/until; 0 reads all time (from the rollups, so still flat).",
    )
    rollup_interval_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often serve and the detector bring the hourly rollups up to date (reads never do: they "
        "count what was written since from the tables, see rollup_read_tail_rows).",
    )
    rollup_lag_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Each rollup refresh looks this far behind its watermark, for writes that committed late.",
    )
    rollup_read_tail_rows: int = Field(
        default=10_000,
        ge=0,
        description="Compare, quality and the version lists count up to this many conversations, outcome links "
        "and verdicts (each) written since the rollup job's last run from the tables, so their figures are "
        "current; with more (the job stopped or far behind) they show the rollups alone and say up to when. "
        "0: the rollups alone.",
    )
    list_count_cap: int = Field(
        default=10_000,
        ge=1,
        description="Lists count matching rows up to this many and then say N+ (a full count grows with the table).",
    )
    agreement_max_labels: int = Field(
        default=5_000,
        ge=1,
        description="Agreement between reviewers (review progress, the calibration page) is measured on the "
        "conversations of the newest this many current labels, so its cost stays flat as labels accumulate.",
    )
    list_max_offset: int = Field(
        default=10_000,
        ge=0,
        description="Largest offset a list accepts; page further with the cursor (keyset pagination).",
    )
    retention_conversations_days: float = Field(
        default=90.0,
        ge=0,
        description="Conversations (and their findings, outcomes, outcome links, judge requests, reviewers' comments) "
        "older than this are deleted; labelled, queued (open in the review queue) and exported conversations are kept. "
        "0 keeps them forever.",
    )
    retention_unjoined_outcomes_days: float = Field(
        default=30.0,
        ge=0,
        description="Outcomes whose conversation is not stored (not arrived yet, or deleted) are deleted this "
        "long after they were received, with review items still waiting for that conversation. 0: forever.",
    )
    retention_open_review_days: float = Field(
        default=90.0,
        ge=0,
        description="Open review items nobody labelled, claimed, assigned or began to review this long after they "
        "entered the queue leave it, so their conversations no longer stay as queued ones and go by the conversations' "
        "retention. 0 keeps them in the queue forever.",
    )
    retention_expired_review_days: float = Field(
        default=365.0,
        ge=0,
        description="An open review item that expired leaves one 'expired' audit event (its reasons, when it was "
        "flagged and expired, how many assigns, skips, comments and other events it had, who acted on it) in place "
        "of its own; that record is deleted this long after the item expired. 0 keeps the records forever.",
    )
    retention_findings_days: float = Field(
        default=90.0,
        ge=0,
        description="Findings older than this are deleted, also of conversations still stored; never of labelled, "
        "queued or exported conversations. 0: forever.",
    )
    retention_verdicts_days: float = Field(
        default=180.0,
        ge=0,
        description="Judge verdicts older than this are deleted; never of labelled, queued or exported "
        "conversations. 0: forever.",
    )
    retention_dead_letters_days: float = Field(
        default=14.0, ge=0, description="Dead letters older than this are deleted. 0 keeps them forever."
    )
    retention_interval_seconds: float = Field(
        default=3600.0, gt=0, description="How often serve and the detector run the retention job."
    )
    retention_batch_rows: int = Field(default=5000, ge=1, description="Rows the retention job deletes per transaction.")
    # --- end scale ---

    @field_validator("log_level")
    @classmethod
    def _upper(cls, v: str) -> str:
        level = v.strip().upper()
        if level not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError(f"must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not {v!r}")
        return level

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, v: SecretStr) -> SecretStr:
        """Read now, so a malformed URL is a setting error naming the variable, not a traceback from deep in
        start-up; the message never repeats the URL, which may hold a password."""
        from sqlalchemy.engine import make_url

        try:
            make_url(v.get_secret_value())
        except Exception:
            raise ValueError(
                "not a database URL (dialect+driver://user:password@host:port/database, or sqlite:///path)"
            ) from None
        return v

    def parsed_api_keys(self) -> list[ApiKey]:
        """Parse ``VIGIL_API_KEYS``; raises ConfigError on a malformed entry."""
        from vigil.errors import ConfigError

        keys: list[ApiKey] = []
        raw = self.api_keys.get_secret_value().strip()
        if not raw:
            return keys
        for i, entry in enumerate(raw.split(",")):
            parts = entry.strip().split(":", 2)
            if len(parts) != 3 or not all(parts):
                raise ConfigError(f"VIGIL_API_KEYS entry {i + 1} must be name:role:key")
            name, role, key = parts
            if role not in ("ingest", "reviewer", "admin"):
                raise ConfigError(
                    f"VIGIL_API_KEYS entry {i + 1} ({name}): role {role!r} is not ingest, reviewer or admin"
                )
            keys.append(ApiKey(name, role, SecretStr(key)))
        return keys

    def rule_pack_paths(self) -> list[Path]:
        import glob

        from vigil.errors import ConfigError

        paths: list[Path] = []
        for pattern in (p.strip() for p in self.rule_packs.split(",")):
            if not pattern:
                continue
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise ConfigError(f"VIGIL_RULE_PACKS: {pattern!r} matches no file")
            paths.extend(Path(m) for m in matches)
        # a file two patterns name ("rules/default.yaml,rules/*.yaml") is one pack, loaded once: loaded
        # twice, each of its rules clashed with itself ("id already defined in rules/default.yaml")
        seen: set[Path] = set()
        unique = []
        for path in paths:
            key = path.resolve()
            if key not in seen:
                seen.add(key)
                unique.append(path)
        return unique

    @property
    def database_url_str(self) -> str:
        return self.database_url.get_secret_value()
