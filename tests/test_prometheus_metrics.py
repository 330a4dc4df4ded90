"""Prometheus metrics of the worker and the mitigation consumer (``--metrics-port``).

The pure pieces (dead-letter kinds, lag) on their own; the Grafana dashboard against what the
processes' registries export; and both processes scraped after a real replay through the broker.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from harness.small_jobs import make_job
from harness.worker_story import worker_story
from prometheus_client.parser import text_string_to_metric_families

from consumers.mitigation import MitigationConsumer
from pipeline.handler import AgentStats
from pipeline.metrics import WorkerMetrics
from producers.replayer import TraceReplayer
from producers.telemetry import TelemetryProducer
from schemas import (
    CheckpointEvaluated,
    Prediction,
    RelaunchCommand,
    SchemaError,
    dead_letter_for,
    decode,
    decode_each,
)
from straggler.cli import build_parser
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.metrics_export import (
    DEAD_LETTER_KINDS,
    LagGauge,
    build_version,
    dead_letter_kind,
    exported_names,
    partition_lags,
)
from straggler.replay import child_process, read_topic

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "straggler-stream.json"
RANGE_BREAKING = {"type": "job_event", "schema_version": 1, "job_id": "j", "event": "ended", "time": 1e15}
"""A valid job_event but for its time, 31 million years on."""
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
PROMQL_WORDS |= {"and", "or", "unless", "inf", "nan"}


def _schema_error(payload: bytes) -> SchemaError:
    with pytest.raises(SchemaError) as caught:
        decode(payload)
    return caught.value


def test_dead_letter_kinds_are_bounded_and_name_the_reason() -> None:
    not_json = _schema_error(b"not json at all")
    bad_version = _schema_error(b'{"type": "task_checkpoint", "schema_version": 99}')
    reasons: dict[str | BaseException, str] = {
        not_json: "payload",
        bad_version: "schema",
        "event for unknown job 'ghost': no job_event 'started' within 30s": "unknown_job",
        "unexpected prediction event on t.task-checkpoints": "unexpected_event",
        "internal error: KeyError: 'x'": "internal",
        _schema_error(orjson.dumps(RANGE_BREAKING)): "range",
        "record of job 'j' has no key: key every record by its job id": "key",
        "record key 'k' is not its job id 'j': key every record by its job id": "key",
        "something nobody foresaw": "other",
    }
    for reason, kind in reasons.items():
        assert dead_letter_kind(reason) == kind
        # the consumer classifies the letter's text: the same kind as the worker's exception
        assert dead_letter_kind(dead_letter_for(b"x", "t", 0, 0, reason, stage="mitigator").error) == kind
    assert set(reasons.values()) == set(DEAD_LETTER_KINDS)


def test_each_process_exports_its_process_platform_and_build_info() -> None:
    worker = WorkerMetrics(AgentStats(), lambda: 0)
    mitigator = MitigationConsumer("127.0.0.1:1", "unlimited").metrics
    for registry in (worker.registry, mitigator.registry):
        names = exported_names(registry)
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
        assert "python_gc_collections_total" in names
        (info,) = [m for m in registry.collect() if m.name == "straggler_build_info"]
        (sample,) = info.samples
        assert sample.value == 1.0 and sample.labels["version"] == build_version() != ""


def test_lag_is_end_minus_position_and_unknown_partitions_are_left_out() -> None:
    ends: dict[tuple[str, int], int | None] = {("a", 0): 10, ("a", 1): 5, ("a", 2): -1001, ("a", 3): 7}
    positions: dict[tuple[str, int], int | None] = {("a", 0): 4, ("a", 1): 5, ("a", 2): 3, ("a", 3): None}
    assert partition_lags(ends, positions) == {("a", 0): 6, ("a", 1): 0}


def test_the_lag_gauge_forgets_partitions_that_moved_away() -> None:
    metrics = WorkerMetrics(AgentStats(), jobs=lambda: 0)
    metrics.lag.update({("in", 0): 3, ("in", 1): 0})
    metrics.lag.update({("in", 1): 2})
    samples = _samples(metrics.registry)
    assert samples["straggler_worker_consumer_lag"] == {(("partition", "1"), ("topic", "in")): 2.0}
    assert isinstance(metrics.lag, LagGauge)


def test_a_scrape_never_reads_the_workers_jobs_table() -> None:
    """The scrape runs on the HTTP server's thread; the jobs table (Faust's) is counted on the worker's
    loop, by the lag sampler. A scrape that touched the table as the worker started left the worker
    hanging on SIGTERM."""

    def jobs() -> int:
        raise AssertionError("the scrape counted the jobs table")

    metrics = WorkerMetrics(AgentStats(), jobs=jobs)
    assert _samples(metrics.registry)["straggler_worker_jobs"] == {(): 0.0}  # until the first tick


def test_the_mitigator_counts_committed_commands_by_action_and_letters_by_kind() -> None:
    consumer = MitigationConsumer("localhost:1", "unlimited")
    command = RelaunchCommand(
        command_id="c",
        job_id="j",
        task_id="t",
        action="duplicate",
        reason="flagged",
        policy="unlimited",
        issued_at=1.0,
        checkpoint_time=1.0,
        attempt=0,
    )
    letter = dead_letter_for(b"{", "t", 0, 0, _schema_error(b"{"), stage="mitigator")
    consumer.metrics.committed([command, command, letter], jobs=3)
    samples = _samples(consumer.metrics.registry)
    assert samples["straggler_mitigator_commands_total"][(("action", "duplicate"),)] == 2.0
    assert samples["straggler_mitigator_commands_total"][(("action", "kill"),)] == 0.0
    assert samples["straggler_mitigator_dead_letters_total"][(("kind", "payload"),)] == 1.0
    assert samples["straggler_mitigator_jobs"][()] == 3.0


def test_the_mitigator_counts_races_won_and_lost_by_their_copies() -> None:
    consumer = MitigationConsumer("localhost:1", "speculate")

    def command(task: str, action: str, attempt: int) -> RelaunchCommand:
        return RelaunchCommand(
            command_id=f"{task}-{action}",
            job_id="j",
            task_id=task,
            action=action,  # type: ignore[arg-type]
            reason="r",
            policy="speculate",
            issued_at=1.0,
            checkpoint_time=1.0,
            attempt=attempt,
        )

    consumer.metrics.committed([command("a", "duplicate", 0), command("b", "duplicate", 2)], jobs=1)
    consumer.metrics.committed([command("a", "kill", 0), command("b", "kill", 3)], jobs=1)  # a's copy won
    consumer.metrics.committed([command("c", "kill", 0)], jobs=1)  # no copy of c: not a race
    races = _samples(consumer.metrics.registry)["straggler_mitigator_races_total"]
    assert races == {(("outcome", "copy_won"),): 1.0, (("outcome", "copy_lost"),): 1.0}
    consumer.metrics.commands_committed(100.0, [99.5, 99.9])
    latency = _samples(consumer.metrics.registry)
    assert latency["straggler_mitigator_command_latency_seconds_count"][()] == 2.0
    assert latency["straggler_mitigator_command_latency_seconds_sum"][()] == pytest.approx(0.6)


def test_metrics_endpoints_are_off_unless_a_port_is_given() -> None:
    parser = build_parser()
    for command in (["worker", "--bootstrap", "b:1"], ["mitigate", "--bootstrap", "b:1"]):
        assert parser.parse_args(command).metrics_port is None
        args = parser.parse_args([*command, "--metrics-port", "9400"])
        assert (args.metrics_port, args.metrics_host) == (9400, "127.0.0.1")
    replay = ["replay", "--format", "synthetic", "--out", "o"]
    assert parser.parse_args(replay).metrics_port is None
    assert parser.parse_args([*replay, "--metrics-port", "9400"]).metrics_port == 9400
    assert '--metrics-port "${METRICS_PORT:-9400}"' in (ROOT / "scripts" / "demo.sh").read_text()


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that are not functions, keywords, label
    names (inside ``{}`` or after ``by``/``without``), strings, durations or numbers."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (legends, label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = match.group(), expr[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function call or a keyword
        if match.start() > 0 and (expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."):
            continue  # the exponent or suffix of a number (1e3)
        names.add(word)
    return names


def test_promql_names_are_extracted_without_functions_labels_or_keywords() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_bucket{kind="x"}[5m]))) / ignoring(k) b_total > 1e3'
    assert promql_metric_names(expr) == {"a_bucket", "b_total"}


def dashboard_metric_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in dashboard["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            found = promql_metric_names(expr)
            assert found, f"panel {panel['title']!r}: no metric in {expr!r}"
            names |= found
    return names


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    """A metric renamed in the code (or the dashboard) breaks this test, not just the dashboard."""
    worker = WorkerMetrics(AgentStats(), jobs=lambda: 0)
    mitigator = MitigationConsumer("localhost:1", "unlimited").metrics
    worker.lag.update({("in", 0): 0})  # the per-partition gauges exist once a partition is assigned
    mitigator.lag.update({("in", 0): 0})
    exported = exported_names(worker.registry) | exported_names(mitigator.registry)
    wanted = dashboard_metric_names()
    assert len(wanted) >= 15  # the extraction found the dashboard's queries
    assert not wanted - exported, f"the dashboard queries metrics nobody exports: {sorted(wanted - exported)}"


# -- both processes, scraped after a replay through the real broker ------------------------------


def _samples(registry_or_text: object) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}, from exposition text or a registry."""
    if isinstance(registry_or_text, str):
        families = text_string_to_metric_families(registry_or_text)
    else:
        families = registry_or_text.collect()  # type: ignore[attr-defined]
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return _samples(response.read().decode())


def _total(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    return sum(samples.get(name, {}).values())


def _eventually(
    check: Callable[[], tuple[bool, object]], timeout: float = 180.0, every: float = 1.0
) -> object:
    """Call ``check`` until its first value is True (bounded); return its last second value."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, value = check()
        except OSError as error:  # the endpoint is not up yet
            done, value = False, error
        if done or time.monotonic() > deadline:
            return value
        time.sleep(every)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_worker_and_mitigator_metrics_after_a_replay(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = TopicNames(f"metrics-{uuid.uuid4().hex[:8]}-")
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    worker_port, mitigator_port = _free_port(), _free_port()
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    worker = [*common, "--datadir", str(tmp_path / "faust"), "--live-interval", "600", "--loglevel", "info"]
    mitigator = [*common, "--policy", "unlimited", "--group", f"{topics.prefix}mitigation"]
    with (
        child_process(["worker", *worker, "--metrics-port", str(worker_port)], tmp_path / "worker.log"),
        child_process(["mitigate", *mitigator, "--metrics-port", str(mitigator_port)], tmp_path / "mit.log"),
    ):
        trace = make_job(160, seed=11, job_id=f"metrics-{uuid.uuid4().hex[:6]}", signal=0.5)
        result = TraceReplayer([trace], kafka_bootstrap, topics=topics, progress=False).run()
        assert result.delivery_failures == 0
        live = f"live-{uuid.uuid4().hex[:6]}"  # started and never ended: tracked by both at the end
        with TelemetryProducer(kafka_bootstrap, topics=topics) as sdk:
            sdk.start_job(live, expected_tasks=5)
            sdk.report(live, "t0", {"cpu": 0.5}, start_time=time.time() - 5)
            sdk.flush()
        from confluent_kafka import Producer

        from straggler.kafka.config import producer_config

        bad = Producer(producer_config(kafka_bootstrap))
        bad.produce(topics.checkpoints, key=live.encode(), value=b"not json at all")
        bad.flush(30)
        inputs = len(read_topic(kafka_bootstrap, topics.checkpoints))
        inputs += len(read_topic(kafka_bootstrap, topics.job_events))
        last_checkpoint = float(trace.checkpoints[-1])

        def caught_up() -> tuple[bool, object]:
            outputs = [e for v in read_topic(kafka_bootstrap, topics.predictions) for e in decode_each(v)]
            records = len(read_topic(kafka_bootstrap, topics.predictions))
            w, m = _scrape(worker_port), _scrape(mitigator_port)
            done = (
                any(
                    isinstance(e, CheckpointEvaluated) and e.checkpoint_time == last_checkpoint
                    for e in outputs
                )
                and _total(w, "straggler_worker_events_total") == inputs
                and _total(m, "straggler_mitigator_records_total") == inputs + records
                and bool(w.get("straggler_worker_consumer_lag"))
                and _total(w, "straggler_worker_consumer_lag") == 0
                and bool(m.get("straggler_mitigator_consumer_lag"))
                and _total(m, "straggler_mitigator_consumer_lag") == 0
                and _total(m, "straggler_mitigator_jobs") >= 1
                and _total(w, "straggler_worker_jobs") >= 1  # sampled on the worker's loop, each second
            )
            return done, (w, m, outputs, records)

        Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
        w, m, outputs, prediction_records = cast(
            tuple[Samples, Samples, list[Any], int], _eventually(caught_up)
        )
        commands = [
            e
            for v in read_topic(kafka_bootstrap, topics.commands)
            for e in decode_each(v)
            if isinstance(e, RelaunchCommand)
        ]

    predictions = [e for e in outputs if isinstance(e, Prediction)]
    markers = [e for e in outputs if isinstance(e, CheckpointEvaluated)]
    flags = sum(p.is_straggler for p in predictions)
    assert predictions and flags and commands, "the scenario must predict, flag and command"

    # the worker: what it consumed is what was produced; what it counts is what it wrote (a miss says
    # where records went: Faust's rebalances and recoveries are in its log at --loglevel info)
    def story() -> str:
        return worker_story(kafka_bootstrap, topics.dead_letters, tmp_path / "worker.log")

    assert _total(w, "straggler_worker_events_total") == inputs, story()
    assert _total(w, "straggler_worker_task_observations_total") == result.observations_produced + 1, story()
    assert _total(w, "straggler_worker_predictions_total") == len(predictions)
    assert _total(w, "straggler_worker_flags_total") == flags
    assert w["straggler_worker_dead_letters_total"][(("kind", "payload"),)] == 1
    assert _total(w, "straggler_worker_dead_letters_total") == 1
    assert _total(w, "straggler_worker_jobs") >= 1  # the live job
    timed = [marker for marker in markers if marker.boundary_produced_at is not None]
    assert _total(w, "straggler_worker_decision_latency_seconds_count") == len(timed) > 0
    assert 0 < _total(w, "straggler_worker_decision_latency_seconds_sum") < 60 * len(timed)
    assert 1 <= _total(w, "straggler_worker_refit_seconds_count") <= len(markers)
    assert _total(w, "straggler_worker_refit_seconds_sum") > 0
    assert {labels[1][1] for labels in w["straggler_worker_consumer_lag"]} == {
        topics.checkpoints,
        topics.job_events,
    }
    # the mitigator: every committed input record, every prediction, every command by its action
    assert _total(m, "straggler_mitigator_records_total") == inputs + prediction_records
    assert _total(m, "straggler_mitigator_predictions_total") == len(predictions)
    assert _total(m, "straggler_mitigator_checkpoints_total") == len(markers)
    by_action = {labels[0][1]: value for labels, value in m["straggler_mitigator_commands_total"].items()}
    assert sum(by_action.values()) == len(commands)
    assert all(by_action[c.action] >= 1 for c in commands)
    assert _total(m, "straggler_mitigator_dead_letters_total") == 0  # the bad record's topic is the agent's
    assert _total(m, "straggler_mitigator_transactions_total") >= 1
    assert _total(m, "straggler_mitigator_command_latency_seconds_count") == len(commands)
    assert 0 < _total(m, "straggler_mitigator_command_latency_seconds_sum") < 60 * len(commands)
    assert _total(m, "straggler_mitigator_transaction_aborts_total") == 0
    assert _total(m, "straggler_mitigator_watchdog_restarts_total") == 0
    # and the dashboard reads only what the live endpoints serve
    served = set(w) | set(m)
    assert not dashboard_metric_names() - served, sorted(dashboard_metric_names() - served)
