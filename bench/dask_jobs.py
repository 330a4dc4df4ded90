"""Speculative execution on a real Dask cluster, driven by the stream: does a job finish sooner, and
for how much machine time, than with Dask alone or with Spark's rule?

A `LocalCluster` of process workers with one thread each runs jobs of real tasks: each task computes
with NumPy for a quarter of its planned time, reads its input file (4 MB per planned second, written
before the job starts; Dask's ``sizeof`` of the task's arguments counts it, so the telemetry reports
it as the task's input) and waits out the rest (as on a remote read). Planned times are log-normal
around 1 s, within 0.2-5 s, and a job has a few waves of tasks per worker, as the Google jobs do.
Stragglers come from named mechanisms, one per scenario:

- ``hung-task``: one task's first attempt never returns (a stuck read) and never checks
  `straggler.dask_tasks.cancelled`, so only a worker restart frees its slot;
- ``slow-worker``: every task on one worker of four takes 4x its planned time (its loop runs 4x as
  long, as on a CPU a quarter as fast): a copy elsewhere helps;
- ``input-skew``: the longest task reads 4x the input and takes 4x its time on any worker: a copy
  cannot help;
- ``worker-dies``: the worker running one task's first attempt exits half-way (its nanny restarts it;
  Dask runs the task again elsewhere).

Each scenario runs with Dask alone and under each policy of the stream (worker, mitigator and
`straggler dask-executor` as processes, on the embedded broker), and once without its fault (the
clean run, Dask alone). "Recovered" is (JCT alone - JCT with the policy) / (JCT alone - JCT clean),
on means over the repetitions. Machine time gross: the run time of the attempts the executor started
(copies, relaunches) until they ended or were killed, from its metrics, as a share of the job's planned
work.

    OMP_NUM_THREADS=1 .venv/bin/python bench/dask_jobs.py --reps 5 --json docs/results/dask/dask_jobs.json

Run it alone on a quiet machine: every figure is wall-clock time. ``--policies oracle-copy`` (never
a default) adds `ORACLE`, how much copies could win back of the slow worker's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dask_work
import numpy as np
from benchlib import REPO, broker, dask_cluster, machine, table, wait_group_stable, write_outputs
from dask_work import SLOWDOWN, Fault, InputFile, planned_seconds, run_task, write_input
from matplotlib.figure import Figure
from prometheus_client.parser import text_string_to_metric_families

from pipeline.settings import WorkerSettings, app_id
from straggler.kafka.embedded import free_port
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process

SCENARIOS = ("clean", "hung-task", "slow-worker", "input-skew", "worker-dies")
"""``clean`` is the jobs without a fault: under a policy, what the stream costs a healthy job."""
POLICIES = ("alone", "spark", "spark-legacy", "speculate+reactive", "speculate+nurd")
ORACLE = "oracle-copy"
"""Evaluation only, never a default: told which worker is slow, it copies each attempt on the slow
worker the moment a usual worker has nothing to do, through the same executor, without the stream's
worker and mitigator (so with none of their lag and none of their CPU). How much of the slow worker's
cost copies could win back on this cluster (``--scenarios slow-worker --policies oracle-copy``)."""
WORKERS = 4
LOST_WORKER_TIMEOUT = "distributed.deploy.lost-worker-timeout"
"""A `LocalCluster` closes a worker's nanny for good when, this long (15 s by default) after the
worker left, no worker of its name is registered: a worker that died (or was restarted for a kill)
and is restarting again at that moment is never back. The stream's runs, one every 14-15 s, met it
(a job then ran on three workers, and the next waited for a fourth that never came); the bench sets
it to an hour, for every run alike."""


@dataclass
class Run:
    """One job's outcome."""

    scenario: str
    policy: str
    rep: int
    jct: float
    finished: bool
    work: float
    extra_seconds: float = 0.0
    copies_won: int = 0
    copies_lost: int = 0
    commands: int = 0

    @property
    def gross(self) -> float:
        return self.extra_seconds / self.work if self.work else 0.0


@dataclass
class Pipeline:
    """The stream's stages for one policy: worker, mitigator, Dask executor, on their own topics."""

    bootstrap: str
    scheduler: str
    policy: str
    interval: float
    workdir: Path
    prefix: str = field(default_factory=lambda: f"bench-dask-{uuid.uuid4().hex[:8]}-")
    metrics_port: int = field(default_factory=free_port)
    speculative: Any = None
    """The adapter (`producers.dask_job.SpeculativeClient`) every job of the pipeline is submitted
    through: made once, as a user makes it, so no job pays for its telemetry plugin's start."""

    @contextlib.contextmanager
    def running(self, client: Any) -> Iterator[Pipeline]:
        """The stages and the adapter, each stage consuming before the first job (its start is not the
        first job's delay). Under the `ORACLE`, the executor alone: the oracle sends the commands."""
        from producers.dask_job import SpeculativeClient

        policy, _, method = self.policy.partition("+")
        create_topics(self.bootstrap, partitions=2, prefix=self.prefix)
        common = ["--bootstrap", self.bootstrap, "--topic-prefix", self.prefix]
        worker = [
            "worker", *common, "--partitions", "2", "--live-interval", str(self.interval),
            "--datadir", str(self.workdir / f"{self.prefix}faust"),
        ]  # fmt: skip
        if method:
            worker += ["--method", method]
        mitigator = [
            "mitigate", *common, "--policy", policy, "--checkpoint-seconds", str(self.interval),
            "--group", f"{self.prefix}mitigation",
        ]  # fmt: skip
        executor = [
            "dask-executor", *common, "--scheduler", self.scheduler, "--group", f"{self.prefix}executor",
            "--metrics-port", str(self.metrics_port),
        ]  # fmt: skip
        stages = {"executor": (f"{self.prefix}executor", executor)}  # name: (consumer group, command)
        if self.policy != ORACLE:
            settings = WorkerSettings(self.bootstrap, topics=TopicNames(self.prefix))
            worker_group, mitigator_group = app_id(settings), f"{self.prefix}mitigation"
            stages = {"worker": (worker_group, worker), "mitigator": (mitigator_group, mitigator), **stages}
        logs = self.workdir / self.prefix
        with contextlib.ExitStack() as running:
            for name, (_, args) in stages.items():
                running.enter_context(child_process(args, Path(f"{logs}{name}.log")))
            self.speculative = running.enter_context(
                SpeculativeClient(client, self.bootstrap, topic_prefix=self.prefix, interval=self.interval)
            )
            for group, _ in stages.values():
                wait_group_stable(self.bootstrap, group, timeout=120)
            self.executor_counters()
            yield self

    def executor_counters(self) -> dict[str, float]:
        """The executor's counters now, from its Prometheus endpoint (a few tries: it answers slowly
        under load; a run whose costs cannot be read fails rather than count zeros)."""
        names = {
            "straggler_executor_extra_machine_seconds_total": "extra_seconds",
            "straggler_executor_copies_won_total": "copies_won",
            "straggler_executor_copies_lost_total": "copies_lost",
            "straggler_executor_applied_total": "commands",
        }
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        for attempt in range(10):
            try:
                with urllib.request.urlopen(url, timeout=5) as page:
                    text = page.read().decode()
                break
            except OSError:
                if attempt == 9:
                    raise
                time.sleep(1.0)
        found = dict.fromkeys(names.values(), 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    found[names[sample.name]] = float(sample.value)
        return found


def _busy(dask_worker: Any = None) -> bool:
    """Whether a thread of this worker still runs a task (a hung attempt, a cancelled one)."""
    return bool(dask_worker.active_threads)


def fresh_cluster_state(client: Any) -> None:
    """Every worker up and idle: restart those still running a task (a hung attempt's thread, deaf to
    cancellation), one by one (restarting all at once, with a broker started before the cluster in
    this process, never brought them back here)."""
    client.wait_for_workers(WORKERS, timeout=120)
    deadline = time.monotonic() + 10.0
    while (
        busy := [w for w, running in client.run(_busy).items() if running]
    ) and time.monotonic() < deadline:
        time.sleep(0.5)  # a cancelled attempt that checks cancelled() stops by itself
    if busy:
        client.restart_workers(busy, timeout=120)
        client.wait_for_workers(WORKERS, timeout=120)


def run_alone(
    client: Any, seconds: Sequence[float], inputs: Sequence[InputFile], fault: Fault | None, bound: float
) -> float | None:
    """The job on Dask alone: its completion time, None past ``bound``."""
    from distributed import wait

    started = time.monotonic()
    futures = [
        client.submit(run_task, i, s, data, fault, pure=False, key=f"alone-{uuid.uuid4().hex[:8]}-{i}")
        for i, (s, data) in enumerate(zip(seconds, inputs, strict=True))
    ]
    deadline = started + bound
    # `wait` returns once every future has been done at some time: a result lost with a dead worker
    # (then computed again) counts, so wait again until every result is there at once
    while not all(f.status == "finished" for f in futures) and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            wait(futures, timeout=max(deadline - time.monotonic(), 0.0), return_when="ALL_COMPLETED")
        if any(f.status == "error" for f in futures):
            break
        time.sleep(0.05)
    jct = time.monotonic() - started
    failed = [f for f in futures if f.status == "error"]
    if failed:
        raise RuntimeError(f"a task of the job failed: {failed[0].exception()!r}")
    finished = all(f.status == "finished" for f in futures)
    client.cancel(futures, force=True)
    return jct if finished else None


def run_streamed(
    pipeline: Pipeline,
    seconds: Sequence[float],
    inputs: Sequence[InputFile],
    fault: Fault | None,
    bound: float,
) -> float | None:
    """The job through the adapter, its telemetry and the executor's commands: its completion time,
    None past ``bound``."""
    job_id = f"bench-{uuid.uuid4().hex[:8]}"
    oracle: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if pipeline.policy == ORACLE:
        assert fault is not None  # main() runs the oracle on slow-worker jobs only
        oracle = copying_off_the_slow_worker(pipeline, job_id, fault.slow_worker)
    with pipeline.speculative.job(job_id, expected_tasks=len(seconds)) as job, oracle:
        started = time.monotonic()
        futures = [
            job.submit(run_task, i, s, data, fault)
            for i, (s, data) in enumerate(zip(seconds, inputs, strict=True))
        ]
        try:
            job.gather(futures, timeout=bound)
        except TimeoutError:
            return None
        return time.monotonic() - started


@contextlib.contextmanager
def copying_off_the_slow_worker(pipeline: Pipeline, job_id: str, slow_worker: str) -> Iterator[None]:
    """The `ORACLE`: while the block runs, each first attempt of the job that the scheduler has on the
    slow worker (running, or waiting there) is copied, by a ``duplicate`` command to the executor, as
    soon as a usual worker has nothing to do: one copy per idle worker, each attempt once."""
    import threading

    from confluent_kafka import Producer

    from schemas import RelaunchCommand, command_id, encode
    from straggler.dask_tasks import parse_attempt_key
    from straggler.kafka.config import producer_config

    client = pipeline.speculative.client
    topic = TopicNames(pipeline.prefix).commands
    producer = Producer(producer_config(pipeline.bootstrap))
    stop = threading.Event()
    copied: set[str] = set()

    def watch() -> None:
        while not stop.wait(0.05):
            names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
            processing = client.processing()
            slow = [a for a, name in names.items() if name == slow_worker]
            idle = [a for a in names if a not in slow and not processing.get(a)]
            on_slow = [parse_attempt_key(k) for a in slow for k in processing.get(a, ())]
            mine = [p for p in on_slow if p is not None and p[0] == job_id and p[2] == 0]
            mine = [p for p in mine if p[1] not in copied]
            for (_, task_id, _), _ in zip(mine, idle, strict=False):
                now = time.time()
                command = RelaunchCommand(
                    command_id=command_id(job_id, task_id, "duplicate", "oracle"),
                    job_id=job_id, task_id=task_id, action="duplicate", reason="oracle: on the slow worker",
                    policy=ORACLE, issued_at=now, checkpoint_time=now, attempt=0,
                )  # fmt: skip
                producer.produce(topic, key=job_id.encode(), value=encode(command))
                copied.add(task_id)
            producer.poll(0)

    thread = threading.Thread(target=watch, name="oracle-copy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        producer.flush(30)


def one_run(
    client: Any,
    pipeline: Pipeline | None,
    scenario: str,
    policy: str,
    rep: int,
    args: argparse.Namespace,
    tmp: str,
) -> Run:
    seconds = planned_seconds(args.tasks, seed=1000 + rep)
    fresh_cluster_state(client)  # before naming the slow worker: a restarted one may be back only now
    fault = None
    if scenario == "input-skew":  # the job's longest task reads SLOWDOWN x the input, and takes as long
        seconds[int(np.argmax(seconds))] *= SLOWDOWN
    if scenario != "clean":
        worker_names = sorted(str(w["name"]) for w in client.scheduler_info()["workers"].values())
        fault = Fault(
            scenario,
            task=int(np.argmax(seconds)) if scenario == "input-skew" else args.tasks // 2,
            slow_worker=worker_names[0],
            marker=str(Path(tmp) / f"marker-{uuid.uuid4().hex[:8]}"),
        )
    inputs = [write_input(tmp, i, s) for i, s in enumerate(seconds)]
    before = pipeline.executor_counters() if pipeline else {}
    try:
        if pipeline is None:
            jct = run_alone(client, seconds, inputs, fault, args.bound)
        else:
            jct = run_streamed(pipeline, seconds, inputs, fault, args.bound)
    finally:
        for data in inputs:
            Path(data.path).unlink(missing_ok=True)
    run = Run(scenario, policy, rep, args.bound if jct is None else jct, jct is not None, float(sum(seconds)))
    if pipeline is not None:
        time.sleep(args.settle)  # the losers' kills and the executor's accounting
        after = pipeline.executor_counters()
        run.extra_seconds = after["extra_seconds"] - before["extra_seconds"]
        run.copies_won = int(after["copies_won"] - before["copies_won"])
        run.copies_lost = int(after["copies_lost"] - before["copies_lost"])
        run.commands = int(after["commands"] - before["commands"])
    state = "" if run.finished else f" (not finished within {args.bound:g} s)"
    print(
        f"  {scenario:>11} {policy:>18} rep {rep}: JCT {run.jct:6.1f} s{state}, gross {run.gross:+.1%}, "
        f"copies won/lost {run.copies_won}/{run.copies_lost}",
        flush=True,
    )
    return run


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    """Per scenario and policy: JCT mean, spread and p99, recovered share, gross machine time, copies."""
    clean = [r.jct for r in runs if r.scenario == "clean" and r.policy == "alone"]
    clean_mean = float(np.mean(clean)) if clean else math.nan
    rows = []
    for scenario in SCENARIOS:
        alone = [r.jct for r in runs if r.scenario == scenario and r.policy == "alone"]
        alone_mean = float(np.mean(alone)) if alone else math.nan
        for policy in (*POLICIES, ORACLE):
            mine = [r for r in runs if r.scenario == scenario and r.policy == policy]
            if not mine:
                continue
            jct = np.array([r.jct for r in mine])
            cost = alone_mean - clean_mean
            rows.append(
                {
                    "scenario": scenario,
                    "policy": policy,
                    "reps": len(mine),
                    "finished": sum(r.finished for r in mine),
                    "jct_mean": float(jct.mean()),
                    "jct_std": float(jct.std(ddof=1)) if len(jct) > 1 else 0.0,
                    "jct_p99": float(np.percentile(jct, 99)),
                    "clean_mean": clean_mean,
                    "straggler_cost": cost / clean_mean if clean_mean else math.nan,
                    # the share of the straggler's cost won back; undefined when it costs (almost) nothing
                    "recovered": (alone_mean - float(jct.mean())) / cost
                    if cost > 0.05 * clean_mean
                    else math.nan,
                    "gross": float(np.mean([r.gross for r in mine])),
                    "copies_won": sum(r.copies_won for r in mine),
                    "copies_lost": sum(r.copies_lost for r in mine),
                }
            )
    return rows


def plot(rows: list[dict[str, Any]]) -> Any:
    def draw(figure: Figure) -> None:
        axes = figure.subplots(1, len(SCENARIOS), sharey=False)
        for ax, scenario in zip(np.atleast_1d(axes), SCENARIOS, strict=True):
            mine = [r for r in rows if r["scenario"] == scenario]
            if not mine:
                continue
            x = np.arange(len(mine))
            ax.bar(x, [r["jct_mean"] for r in mine], yerr=[r["jct_std"] for r in mine], color="tab:blue")
            ax.axhline(mine[0]["clean_mean"], color="gray", linestyle="--", label="clean")
            ax.set_xticks(x, [r["policy"] for r in mine], rotation=60, ha="right", fontsize=7)
            ax.set_title(scenario, fontsize=9)
        np.atleast_1d(axes)[0].set_ylabel("job completion time, s (mean, sd)")
        np.atleast_1d(axes)[0].legend(fontsize=7)

    return draw


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=None, help="a running broker (default: an embedded one)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--tasks", type=int, default=24, help="tasks per job (default 24: 6 waves on 4 workers)"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--interval", type=float, default=1.0, help="telemetry, evaluation and checkpoint seconds"
    )
    parser.add_argument(
        "--bound", type=float, default=60.0, help="seconds a job may run before it counts as unfinished"
    )
    parser.add_argument(
        "--settle", type=float, default=4.0, help="seconds after a job for kills and accounting"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the stages' logs here (default: deleted at the end)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in --json (written after every run) and run only the others",
    )
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    policies = [p for p in args.policies.split(",") if p]
    unknown = [s for s in scenarios if s not in SCENARIOS] + [
        p for p in policies if p not in (*POLICIES, ORACLE)
    ]
    if unknown or args.reps < 1 or args.tasks < WORKERS or not args.interval > 0 or not args.bound > 0:
        print(
            f"error: unknown {unknown} or a bad number; scenarios {SCENARIOS}, "
            f"policies {(*POLICIES, ORACLE)}",
            file=sys.stderr,
        )
        return 2

    if ORACLE in policies and set(scenarios) != {"slow-worker"}:
        print(f"error: {ORACLE} knows the slow worker only: pass --scenarios slow-worker", file=sys.stderr)
        return 2

    import cloudpickle
    import dask

    cloudpickle.register_pickle_by_value(dask_work)  # the workers need not import it
    runs: list[Run] = resumed(args)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="dask-jobs-") as tmp,
        broker(args.bootstrap) as bootstrap,
        dask.config.set({LOST_WORKER_TIMEOUT: "1h"}),
        dask_cluster(WORKERS) as client,
    ):
        print(
            f"cluster {client.scheduler.address}, {WORKERS} workers x 1 thread; broker {bootstrap}",
            flush=True,
        )
        done = {(r.scenario, r.policy, r.rep) for r in runs}

        def measure(pipeline: Pipeline | None, scenario: str, policy: str) -> None:
            for rep in range(args.reps):
                if (scenario, policy, rep) not in done:
                    runs.append(one_run(client, pipeline, scenario, policy, rep, args, tmp))
                    done.add((scenario, policy, rep))
                    save(runs, args, started)  # a crash later keeps what was measured (--resume)

        measure(None, "clean", "alone")
        for policy in policies:
            if policy == "alone":
                for scenario in scenarios:
                    measure(None, scenario, policy)
                continue
            if all((scenario, policy, rep) in done for scenario in scenarios for rep in range(args.reps)):
                continue
            logs = Path(tmp) if args.logs is None else args.logs
            logs.mkdir(parents=True, exist_ok=True)
            pipeline = Pipeline(bootstrap, client.scheduler.address, policy, args.interval, logs)
            with pipeline.running(client):
                for scenario in scenarios:
                    measure(pipeline, scenario, policy)
    rows = summarise(runs)
    header = ["scenario", "policy", "done", "JCT mean", "sd", "p99", "recovered", "gross", "won/lost"]
    print(
        table(
            [
                [
                    r["scenario"], r["policy"], f"{r['finished']}/{r['reps']}", r["jct_mean"], r["jct_std"],
                    r["jct_p99"], "–" if math.isnan(r["recovered"]) else f"{r['recovered']:.0%}",
                    f"{r['gross']:+.1%}", f"{r['copies_won']}/{r['copies_lost']}",
                ]
                for r in rows
            ],
            header,
        )
    )  # fmt: skip
    if rows:
        print(f"clean JCT {rows[0]['clean_mean']:.1f} s; wall time {time.monotonic() - started:.0f} s")
    write_outputs(figures(runs, args, started, complete=True), args.json, plot(rows))
    return 0


def figures(runs: list[Run], args: argparse.Namespace, started: float, complete: bool) -> dict[str, Any]:
    """What ``--json`` keeps: the settings, every run, and the summary rows of them."""
    return {
        "machine": machine(),
        "settings": settings(args),
        "workers": WORKERS,
        "complete": complete,
        "wall_seconds": time.monotonic() - started,
        "rows": summarise(runs),
        "runs": [asdict(r) for r in runs],
        "repo": str(REPO),
    }


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options as ``--json`` keeps them (paths as text)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def save(runs: list[Run], args: argparse.Namespace, started: float) -> None:
    """The runs so far, as ``--json`` (no plot: that comes with the last run)."""
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        kept = figures(runs, args, started, complete=False)
        args.json.write_text(json.dumps(kept, indent=2, default=float))


def resumed(args: argparse.Namespace) -> list[Run]:
    """The runs an earlier, interrupted run of the same settings kept in ``--json``."""
    if not args.resume or args.json is None or not args.json.exists():
        return []
    kept = json.loads(args.json.read_text())
    mine = settings(args)
    same = ("reps", "tasks", "interval", "bound", "settle")
    if any(kept["settings"].get(k) != mine[k] for k in same):
        raise SystemExit(f"error: {args.json} was measured with other settings; run without --resume")
    return [Run(**r) for r in kept["runs"]]


if __name__ == "__main__":
    sys.exit(main())
