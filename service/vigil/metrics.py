"""Every Prometheus metric Vigil exposes, namespace ``vigil``. Each test builds its own registry.

Kept whole on purpose: all metrics live in one module (STYLE.md, principle 9), so one file lists every name.

Label values that come from traffic (agent ids, versions) pass through :class:`LabelGuard`, which
folds values past a fixed budget into ``other`` so a misbehaving client cannot explode cardinality.
Names bounded by configuration (rule ids, outcome types, judge names and models, the detector's
signals) have guards of their own: the configured names are admitted up front and never fold, and
only names outside the configuration (a rule since removed) draw on a budget.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics

# No ``*_created`` series: they double the series count and Prometheus reads the start time elsewhere.
disable_created_metrics()

NS = "vigil"
OTHER = "other"


class LabelGuard:
    """Admits at most ``limit`` distinct values beyond those :meth:`admit`-ted; later newcomers become ``other``.

    A value unseen for ``idle_seconds`` gives its place up to a newcomer, and ``on_evict`` drops its
    series, so a long-lived process still labels this week's canary by name after many old versions.
    """

    def __init__(self, limit: int, idle_seconds: float = 0.0, name: str = "") -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self.name = name
        self._known: frozenset[str] = frozenset()
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self.on_evict: list[Callable[[str], None]] = []
        self.on_fold: list[Callable[[], None]] = []

    def admit(self, values: Iterable[str]) -> None:
        """Values from configuration: always kept, and they use none of the budget."""
        with self._lock:
            self._known = self._known | {v for v in values if v}

    def __call__(self, value: str | None) -> str:
        if not value:
            return "unknown"
        if value in self._known:
            return value
        now = time.monotonic()
        if value in self._seen:
            self._seen[value] = now
            return value
        with self._lock:
            if len(self._seen) >= self.limit and self.idle_seconds:
                self._evict_idle(now)
            if len(self._seen) < self.limit:
                self._seen[value] = now
                return value
        for hook in self.on_fold:
            hook()
        return OTHER

    def _evict_idle(self, now: float) -> None:
        idle = [v for v, seen in self._seen.items() if now - seen > self.idle_seconds]
        for v in idle:
            del self._seen[v]
            for hook in self.on_evict:
                hook(v)


class Metrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, max_label_values: int = 50, label_idle_seconds: float = 0.0
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # process_start_time_seconds (and CPU, memory, open files): DeadLettersRising tells a counter born in
        # this process from one a new Prometheus sees for the first time by it
        ProcessCollector(registry=r)
        self.agent = LabelGuard(max_label_values, label_idle_seconds, "agent")
        self.version = LabelGuard(max_label_values, label_idle_seconds, "agent_version")
        # configured names (rule ids, outcome types, judge models) and detector signals: see admit()
        self.label = LabelGuard(max_label_values)
        self.signal = LabelGuard(max_label_values)

        self.conversations_processed = Counter(
            "conversations_processed_total",
            "Conversations checked and stored for the first time (later revisions: conversations_updated_total).",
            ["agent", "agent_version", "source"],
            namespace=NS,
            registry=r,
        )
        self.conversations_updated = Counter(
            "conversations_updated_total",
            "Newer revisions that superseded a stored conversation (a growing conversation).",
            ["agent", "agent_version", "source"],
            namespace=NS,
            registry=r,
        )
        self.conversations_duplicate = Counter(
            "conversations_duplicate_total",
            "Messages whose revision was already stored (redeliveries, replays).",
            ["source"],
            namespace=NS,
            registry=r,
        )
        self.erased_dropped = Counter(
            "erased_dropped_total",
            "Conversations dropped at ingest because they were erased (a tombstone holds their id's hash).",
            ["source"],
            namespace=NS,
            registry=r,
        )
        self.findings = Counter(
            "findings_total",
            "Rule findings.",
            ["rule", "severity", "agent", "agent_version"],
            namespace=NS,
            registry=r,
        )
        self.conversations_flagged = Counter(
            "conversations_flagged_total",
            "Conversations with at least one finding.",
            ["agent", "agent_version", "severity"],
            namespace=NS,
            registry=r,
        )
        self.processing_seconds = Histogram(
            "processing_seconds",
            "Time to decode, check and store one batch, per conversation.",
            ["stage"],
            namespace=NS,
            registry=r,
            buckets=(
                0.00005,
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.5,
                1.0,
            ),
        )
        self.batch_size = Histogram(
            "batch_size_conversations",
            "Conversations per stored batch.",
            namespace=NS,
            registry=r,
            buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 5000),
        )
        self.consumer_lag = Gauge(
            "consumer_lag_messages",
            "Messages behind the partition's end, per assigned partition.",
            ["topic", "partition"],
            namespace=NS,
            registry=r,
        )
        self.consumer_assigned_partitions = Gauge(
            "consumer_assigned_partitions", "Partitions assigned to this consumer.", namespace=NS, registry=r
        )
        self.consumer_broker_answered = Gauge(
            "consumer_broker_answered_timestamp_seconds",
            "When a Kafka broker last answered this consumer (records fetched, or the end offsets an idle consumer "
            "asks for every 10 s). Stops moving while no broker answers: the lag and assigned partitions then keep "
            "their last values.",
            namespace=NS,
            registry=r,
        )
        self.clock_offset = Gauge(
            "clock_offset_seconds",
            "This host's clock minus the database's, as last measured (every 60 s while items arrive or it is "
            "scraped): the clock times arriving are checked against is the database's, so a host clock off by this "
            "much only shows here (alert VigilClockSkew). 0 on SQLite, whose clock is the host's; NaN until first "
            "measured. Keeps its last value while measurements fail (vigil_clock_offset_age_seconds grows).",
            namespace=NS,
            registry=r,
        )
        self.clock_offset_age = Gauge(
            "clock_offset_age_seconds",
            "Seconds since vigil_clock_offset_seconds was measured: under a minute and a bit while the database "
            "answers; grows while a measurement fails or goes unanswered (abandoned after 15 s, the next tried a "
            "minute after it). 0 on SQLite; NaN until first measured.",
            namespace=NS,
            registry=r,
        )
        self.worker_heartbeat_age = Gauge(
            "worker_heartbeat_age_seconds",
            "Seconds since a loop (consumer, judge, detector, trace_finisher, maintenance, otlp_grpc) last "
            "finished an iteration or moved on within long work; the process's /healthz (a worker's metrics port; "
            "the API's in `vigil serve`, which runs the judge and detector loops in-process) answers 503 past "
            "VIGIL_LIVENESS_STALL_SECONDS (plus the loop's own wait). Keeps growing once the loop has ended.",
            ["loop"],
            namespace=NS,
            registry=r,
        )
        self.worker_heartbeat_bound = Gauge(
            "worker_heartbeat_bound_seconds",
            "The heartbeat age past which a loop counts as stalled: VIGIL_LIVENESS_STALL_SECONDS plus the wait "
            "between passes its last beat announced (the finisher's sweep interval, the rollup interval, ...).",
            ["loop"],
            namespace=NS,
            registry=r,
        )
        self.worker_loop_up = Gauge(
            "worker_loop_up",
            "1 while a loop is alive as /healthz judges it; 0 once it is stalled (its heartbeat age past its bound) "
            "or has ended on an error or lost its thread, which its age alone shows only a bound later. A loop "
            "that returned (stopped as asked: a shutdown) stays 1.",
            ["loop"],
            namespace=NS,
            registry=r,
        )
        self.dead_letters = Counter(
            "dead_letters_total",
            "Messages (or request items) set aside as dead letters; a batch's share one stored row per reason.",
            ["reason", "source"],
            namespace=NS,
            registry=r,
        )
        self.ingest_errors = Counter(
            "ingest_errors_total",
            "Ingest failures that were retried (database, broker).",
            ["stage"],
            namespace=NS,
            registry=r,
        )
        self.rule_errors = Counter(
            "rule_errors_total",
            "Rule functions that raised on a conversation.",
            ["rule"],
            namespace=NS,
            registry=r,
        )
        self.rule_timeouts = Counter(
            "rule_timeouts_total",
            "Rules stopped for running over VIGIL_RULE_TIMEOUT_MS on one conversation.",
            ["rule"],
            namespace=NS,
            registry=r,
        )
        self.store_retries = Counter(
            "store_retries_total",
            "Writes tried again after a transient database error (deadlock, serialization, connection).",
            ["kind"],
            namespace=NS,
            registry=r,
        )
        self.unreadable_documents = Counter(
            "unreadable_documents_total",
            "Stored conversations a reader skipped because their document cannot be read back.",
            ["reader"],
            namespace=NS,
            registry=r,
        )
        self.rules_loaded = Gauge("rules_loaded", "Rules loaded from rule packs.", namespace=NS, registry=r)
        self.outcomes = Counter(
            "outcomes_total",
            "Outcome signals received.",
            ["type", "agent", "agent_version"],
            namespace=NS,
            registry=r,
        )
        self.build_info = Gauge("build_info", "Vigil version.", ["version"], namespace=NS, registry=r)

        # --- judge metrics ---
        per_version = ["judge", "judge_version", "agent", "agent_version"]
        self.judge_eligible = Counter(
            "judge_eligible_total",
            "Stored conversations a judge applies to.",
            per_version,
            namespace=NS,
            registry=r,
        )
        self.judge_sampled = Counter(
            "judge_sampled_total",
            "Judge requests enqueued, by reason (sampled, flagged, outcome, min_per_hour, manual).",
            [*per_version, "reason"],
            namespace=NS,
            registry=r,
        )
        self.judge_judged = Counter(
            "judge_judged_total", "Conversations judged (any verdict).", per_version, namespace=NS, registry=r
        )
        self.judge_verdicts = Counter(
            "judge_verdicts_total",
            "Verdicts by judge, verdict and agent version.",
            ["judge", "judge_version", "verdict", "agent", "agent_version", "offline"],
            namespace=NS,
            registry=r,
        )
        self.judge_score = Histogram(
            "judge_score",
            "Scores (0..1) of scored verdicts.",
            ["judge", "judge_version"],
            namespace=NS,
            registry=r,
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
        )
        self.judge_latency_seconds = Histogram(
            "judge_latency_seconds",
            "Model call latency of one judgement attempt.",
            ["judge"],
            namespace=NS,
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
        )
        self.judge_cost_usd = Counter(
            "judge_cost_usd_total",
            "Spend on judge model calls (litellm's cost figures).",
            ["judge", "model"],
            namespace=NS,
            registry=r,
        )
        self.judge_tokens = Counter(
            "judge_tokens_total",
            "Tokens used by judge model calls.",
            ["judge", "kind"],
            namespace=NS,
            registry=r,
        )
        self.judge_errors = Counter(
            "judge_errors_total",
            "Judge model call errors by class "
            "(retryable, config, rejected, parse, gave_up, usage_anomaly, bad_request).",
            ["judge", "class"],
            namespace=NS,
            registry=r,
        )
        self.judge_queue_depth = Gauge(
            "judge_queue_depth", "Judge requests pending or running.", ["judge"], namespace=NS, registry=r
        )
        self.judge_state = Gauge(
            "judge_state",
            "1 for the judge's current state (running, paused_budget, budget_unknown, stopped_config_error, "
            "circuit_open).",
            ["judge", "state"],
            namespace=NS,
            registry=r,
        )
        self.judge_budget_used_usd = Gauge(
            "judge_budget_used_usd", "Spend of the current UTC day.", ["judge"], namespace=NS, registry=r
        )
        self.judge_budget_usd = Gauge("judge_budget_usd", "Daily spend cap.", ["judge"], namespace=NS, registry=r)
        self.judge_pairwise = Counter(
            "judge_pairwise_total",
            "Pairwise comparisons by result (a, b, tie, position_bias, unscored).",
            ["judge", "result"],
            namespace=NS,
            registry=r,
        )
        self.judge_sampled_verdicts = Counter(
            "judge_sampled_verdicts_total",
            "Scored verdicts of randomly sampled requests, the first per conversation and judge version: "
            "the unbiased base of a judge's failure rate (flagged and outcome-driven requests left out).",
            ["judge", "judge_version", "verdict", "agent", "agent_version", "offline"],
            namespace=NS,
            registry=r,
        )
        # --- end judge metrics ---

        # --- review metrics ---
        self.review_enqueued = Counter(
            "review_enqueued_total",
            "Conversations that entered the review queue, by first reason kind.",
            ["reason"],
            namespace=NS,
            registry=r,
        )
        self.review_reasons = Counter(
            "review_reasons_total",
            "Reasons added to review items (first or later signals).",
            ["reason"],
            namespace=NS,
            registry=r,
        )
        self.review_claims = Counter(
            "review_claims_total",
            "Claim attempts by result (claimed, empty, conflict).",
            ["result"],
            namespace=NS,
            registry=r,
        )
        self.review_labels = Counter(
            "review_labels_total",
            "Labels saved by reviewers (including changed labels).",
            ["label"],
            namespace=NS,
            registry=r,
        )
        self.review_queue_open_items = Gauge(
            "review_queue_open_items",
            "Review items waiting for a reviewer (read from the database at scrape).",
            namespace=NS,
            registry=r,
        )
        self.review_label_seconds = Histogram(
            "review_label_seconds",
            "Time from claim to label.",
            namespace=NS,
            registry=r,
            buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 3600),
        )
        self.review_assignments_timed_out = Counter(
            "review_assignments_timed_out_total",
            "Assignments the retention job released after VIGIL_REVIEW_ASSIGNMENT_TIMEOUT_HOURS without activity.",
            namespace=NS,
            registry=r,
        )
        # --- end review metrics ---

        # --- outcomes and detector metrics ---
        self.outcomes_received = Counter(
            "outcomes_received_total",
            "Outcome signals stored (new idempotency keys).",
            ["type", "source"],
            namespace=NS,
            registry=r,
        )
        self.outcomes_duplicate = Counter(
            "outcomes_duplicate_total",
            "Outcome signals whose idempotency key was already stored.",
            ["source"],
            namespace=NS,
            registry=r,
        )
        self.outcomes_outside_window = Counter(
            "outcomes_outside_window_total",
            "Outcomes joined to a conversation but outside the attribution window.",
            ["type"],
            namespace=NS,
            registry=r,
        )
        quality = ["signal", "agent", "agent_version"]
        self.quality_rate = Gauge(
            "quality_rate",
            "Rate of a quality signal per agent version (failures per conversation).",
            quality,
            namespace=NS,
            registry=r,
        )
        self.quality_rate_lower = Gauge(
            "quality_rate_lower",
            "Lower bound of the 95% Wilson interval of vigil_quality_rate.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.quality_rate_upper = Gauge(
            "quality_rate_upper",
            "Upper bound of the 95% Wilson interval of vigil_quality_rate.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.quality_observations = Gauge(
            "quality_observations",
            "Conversations (or scored verdicts) behind vigil_quality_rate.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.quality_baseline_rate = Gauge(
            "quality_baseline_rate",
            "Baseline rate the detector compares a version against.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.regression_detected = Gauge(
            "regression_detected",
            "1 while the detector holds a signal of a version to have regressed.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.detector_statistic = Gauge(
            "detector_statistic",
            "CUSUM log-likelihood-ratio statistic; alarms at vigil_detector_threshold.",
            quality,
            namespace=NS,
            registry=r,
        )
        self.detector_threshold = Gauge(
            "detector_threshold",
            "CUSUM alarm threshold log(ARL0 x number of CUSUMs).",
            namespace=NS,
            registry=r,
        )
        self.detector_leader = Gauge(
            "detector_leader", "1 if this process holds the detector lease.", namespace=NS, registry=r
        )
        self.detector_ticks = Counter(
            "detector_ticks_total",
            "Detector passes over newly stored data.",
            ["result"],
            namespace=NS,
            registry=r,
        )
        self.detector_last_run = Gauge(
            "detector_last_run_timestamp_seconds",
            "When the detector state was last refreshed.",
            namespace=NS,
            registry=r,
        )
        self.detector_cursor = Gauge(
            "detector_cursor_timestamp_seconds",
            "How far stored conversations have been folded (by received_at). Ahead of the clock, a pass ran on "
            "a clock that was ahead: what is stored until the clock catches up is not folded.",
            namespace=NS,
            registry=r,
        )
        self.detections = Counter(
            "detections_total",
            "Regressions the detector started.",
            ["signal", "agent", "agent_version"],
            namespace=NS,
            registry=r,
        )
        # --- end outcomes and detector metrics ---

        # --- calibration metrics ---
        self.export_tasks = Counter(
            "export_tasks_total",
            "Eval tasks exported from confirmed failures, by format.",
            ["format"],
            namespace=NS,
            registry=r,
        )
        self.export_grouped = Counter(
            "export_grouped_total",
            "Confirmed failures folded into an earlier task as near-duplicates, by format.",
            ["format"],
            namespace=NS,
            registry=r,
        )
        self.export_redactions = Counter(
            "export_redactions_total",
            "PII matches redacted from exported tasks, by kind.",
            ["kind"],
            namespace=NS,
            registry=r,
        )
        self.calibration_runs = Counter(
            "calibration_runs_total",
            "Calibration reports computed by `vigil calibrate` or the API, by result state.",
            ["state"],
            namespace=NS,
            registry=r,
        )
        # --- end calibration metrics ---

        # --- tracing metrics ---
        self.otlp_spans = Counter(
            "otlp_spans_total",
            "Spans received at POST /v1/traces, by what became of them.",
            ["outcome"],
            namespace=NS,
            registry=r,
        )
        self.otlp_conversations = Counter(
            "otlp_conversation_revisions_total",
            "Conversation revisions assembled from OTLP spans.",
            namespace=NS,
            registry=r,
        )
        self.otlp_log_records = Counter(
            "otlp_log_records_total",
            "Log records received at POST /v1/logs (or over gRPC), by what became of them.",
            ["outcome"],
            namespace=NS,
            registry=r,
        )
        self.otlp_finished = Counter(
            "otlp_conversations_finished_total",
            "Traced conversations finished, by how: their root spans ended (root) or they went idle (idle).",
            ["how"],
            namespace=NS,
            registry=r,
        )
        # --- end tracing metrics ---

        self.label_values_folded = Counter(
            "label_values_folded_total",
            "Label values counted as 'other' because the label's budget of distinct values was full.",
            ["label"],
            namespace=NS,
            registry=r,
        )
        for guard in (self.agent, self.version):
            guard.on_evict.append(functools.partial(self._drop_series, guard.name))
            guard.on_fold.append(self.label_values_folded.labels(guard.name).inc)

    def _drop_series(self, label: str, value: str) -> None:
        """Remove every series whose ``label`` is ``value`` (an idle agent or version gave its place up)."""
        for metric in list(vars(self).values()):
            names = getattr(metric, "_labelnames", ())
            if label not in names:
                continue
            at = names.index(label)
            # prometheus_client keeps child series in ``_metrics`` keyed by label-value tuples
            for key in [k for k in list(getattr(metric, "_metrics", {})) if k[at] == value]:
                metric.remove(*key)
