"""A held-out Google 2011 usage trace whose stragglers have known, separately simulated causes.

Written independently of the project's own synthetic generator and of the predictors (nothing here
comes from ``straggler.core`` or ``straggler.traces.synthetic``), so that a predictor can be judged on
data it was not tuned on. The output is the ``task_events`` + ``task_usage`` layout of clusterdata-2011-2
(gzipped CSV parts, microseconds, 300 s usage windows aligned on the trace clock), read by
``straggler evaluate --format google-2011-usage``; a ``ground_truth.csv.gz`` beside them (which the
loader never reads) names the cause of every attempt.

The cluster. Jobs of 100–2000 tasks (log-normal, median 300) arrive about every 10 minutes on a shared
pool of 500 machines; a job runs at most ceil(n / waves) tasks at once (1–4 waves), a task starting when
a slot frees. A task's nominal work is the job's median (3–20 minutes, log-uniform) times σ 0.15 noise;
its run ends when that work is done at its machine's speed. Each job draws a proneness in 0.3–1.7 that
scales its rates of skew, hidden slowdowns and hangs. Latency causes, each visible only in part:

1. slow machines — 8 % of machines run at 0.40–0.75 of nominal speed all the time. Their tasks show a
   higher CPI (speed^-a, a drawn per machine in 0.15–0.8) and a somewhat lower CPU rate (speed^b, b in
   0–0.5); other machines' own CPI spread (σ 0.2) hides part of it, and 4 % of machines report no
   CPI/MAI at all.
2. contention episodes — each machine has overload windows (one every ~5 h on average, 5–90 minutes
   long, intensity 1.3–3×) that slow every task on it while they last. Each episode shows in CPI,
   memory accesses per instruction, CPU rate and page cache with its own exponents (sometimes barely),
   only in the windows that overlap it.
3. input skew — 5 % of tasks have 1.5–4.5× the work (Pareto tail); seen in disk I/O time, memory and
   local disk with per-task exponents (0–0.9) under task-level noise of σ 0.3–0.5.
4. evictions — each attempt is evicted with probability 5 % at a random point; the task is resubmitted
   and restarts from scratch on another machine (EVICT, SUBMIT, then SCHEDULE), and the restart is
   1.05–4× slower (cold caches, remote input: higher disk I/O). The loader sees the last run plus the
   eviction count.
5. hidden slowdowns — 3.5 % of tasks do 1.4–4.5× more work (Pareto tail) with nothing in any feature.
6. hung attempts — 1.2 % of attempts stall for 3–60 minutes (median 8) part-way: CPU near zero, disk I/O
   near zero, CPI erratic, visible only once a window covering the stall has closed.

Every task carries its own usage noise (σ 0.1–0.5 per column and task, 0.03–0.35 per window), and 1 %
of windows are missing. The mix, as the share of stragglers (latency >= the job's p90, last runs) whose
largest slowdown factor is each cause, on the held-out trace (``--jobs 60 --seed 2027``: 23,045 tasks,
median 290 per job, median latency 7.4 min, p90/median 1.9 in the median job): slow machines 16.8 %,
contention 22.7 %, input skew 26.9 %, evictions 12.0 %, hidden 15.3 %, hung 6.4 % (`MEASURED_MIX`).
Everything is drawn from one `numpy.random.SeedSequence` per seed: a seed gives the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from straggler.traces.usage import EVICT, FINISH, SCHEDULE, TASK_USAGE_COLUMNS

SUBMIT = 0
JOB_ID_BASE = 7_300_000_000
"""Job j is written as ``JOB_ID_BASE + j``."""
TRACE_START_S = 600.0
"""The real trace's clock starts at 600 s (0 means "before the trace"); the first job arrives after it."""
WINDOW_S = 300.0
"""task_usage windows end on multiples of 300 s of trace time (or at the end of the run)."""
GROUND_TRUTH = "ground_truth.csv.gz"
CAUSES: tuple[str, ...] = ("slow_machine", "contention", "input_skew", "eviction", "hidden", "hung")
"""The causes, in the order of the ground truth's factor columns; a straggler with no factor >= 1.2 is
attributed to "none" (ordinary spread)."""
DOMINANCE_MIN = 1.2
MEASURED_MIX: dict[str, float] = {
    "slow_machine": 0.168,
    "contention": 0.227,
    "input_skew": 0.269,
    "eviction": 0.120,
    "hidden": 0.153,
    "hung": 0.064,
    "none": 0.0,
}
"""Share of stragglers per dominant cause on ``--jobs 60 --seed 2027`` (`straggler_mix` of that run)."""

_VALUE_COLUMNS = TASK_USAGE_COLUMNS[5:]
_EVENT_TAIL_COLUMNS = 7  # user, scheduling class, priority, cpu/memory/disk request, machine constraint


@dataclass(frozen=True)
class CausalConfig:
    """Every knob of the generator; the defaults are the held-out trace's."""

    machines: int = 500
    median_tasks: float = 300.0
    task_sigma: float = 0.75
    min_tasks: int = 100
    max_tasks: int = 2000
    wave_counts: tuple[int, ...] = (1, 2, 3, 4)
    wave_weights: tuple[float, ...] = (0.45, 0.35, 0.15, 0.05)
    mean_arrival_gap_s: float = 600.0
    job_median_work_s: tuple[float, float] = (180.0, 1200.0)
    work_sigma: float = 0.15
    slow_machine_share: float = 0.08
    slow_speed: tuple[float, float] = (0.40, 0.75)
    contention_mean_gap_s: float = 5 * 3600.0
    contention_median_s: float = 1200.0
    contention_range_s: tuple[float, float] = (300.0, 5400.0)
    contention_intensity: tuple[float, float] = (1.3, 3.0)
    skew_share: float = 0.05
    skew_scale: float = 1.5
    skew_alpha: float = 2.5
    eviction_probability: float = 0.05
    restart_penalty_median: float = 1.6
    hidden_share: float = 0.035
    hidden_scale: float = 1.4
    hidden_alpha: float = 2.5
    tail_cap: float = 4.5
    hang_probability: float = 0.012
    hang_median_s: float = 480.0
    hang_range_s: tuple[float, float] = (180.0, 3600.0)
    job_proneness: tuple[float, float] = (0.3, 1.7)
    cpi_missing_share: float = 0.04
    window_drop_probability: float = 0.01


@dataclass
class _Episodes:
    """One machine's contention episodes, sorted and disjoint, with how each one shows in the features."""

    start: list[float]
    end: list[float]
    intensity: list[float]
    cpi_exponent: list[float]
    mai_exponent: list[float]
    cpu_exponent: list[float]
    cache_gain: list[float]

    def overlaps(self, a: float, b: float) -> list[tuple[int, float]]:
        """(episode, seconds of overlap with [a, b]) for every episode that overlaps it."""
        out = []
        i = bisect_right(self.end, a)
        while i < len(self.start) and self.start[i] < b:
            overlap = min(b, self.end[i]) - max(a, self.start[i])
            if overlap > 0:
                out.append((i, overlap))
            i += 1
        return out

    def advance(self, t0: float, work: float, speed: float) -> float:
        """When ``work`` seconds of nominal work, started at ``t0`` at ``speed``, are done."""
        t, left = t0, work
        i = bisect_right(self.end, t)
        n = len(self.start)
        while True:
            if i < n and self.start[i] <= t:
                segment_end, rate, following = self.end[i], speed / self.intensity[i], i + 1
            else:
                segment_end, rate, following = (self.start[i] if i < n else math.inf), speed, i
            if rate * (segment_end - t) >= left:
                return t + left / rate
            left -= rate * (segment_end - t)
            t, i = segment_end, following


@dataclass
class _Cluster:
    ids: list[int]
    speed: np.ndarray
    cpi: np.ndarray
    mai: np.ndarray
    cpi_reveal: np.ndarray
    cpu_reveal: np.ndarray
    reports_cpi: np.ndarray
    episodes: list[_Episodes]


@dataclass
class Attempt:
    """One run of one task, as the ground truth file lists it."""

    job_id: int
    task: int
    attempt: int
    machine: int
    start: float
    end: float
    outcome: int
    factors: dict[str, float]
    last: bool = False


@dataclass
class CausalTraceSummary:
    """What was written: counts, and the share of stragglers (last runs >= job p90) per dominant cause."""

    out_dir: Path
    jobs: int
    tasks: int
    attempts: int
    usage_rows: int
    stragglers: int
    mix: dict[str, float] = field(default_factory=dict)


def _lognormal(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(median * math.exp(sigma * rng.standard_normal()))


def _make_cluster(rng: np.random.Generator, config: CausalConfig, horizon: float) -> _Cluster:
    n = config.machines
    ids = [int(i) for i in dict.fromkeys(rng.integers(1_000_000, 400_000_000, size=2 * n).tolist())][:n]
    slow = rng.random(n) < config.slow_machine_share
    speed = np.where(slow, rng.uniform(*config.slow_speed, size=n), rng.lognormal(0.0, 0.04, size=n))
    speed = np.minimum(speed, 1.1)
    episodes = []
    low, high = config.contention_range_s
    for _ in range(n):
        starts: list[float] = []
        ends: list[float] = []
        t = TRACE_START_S - rng.uniform(0.0, config.contention_mean_gap_s)
        while True:
            t += rng.exponential(config.contention_mean_gap_s)
            if t > horizon:
                break
            duration = min(max(_lognormal(rng, config.contention_median_s, 0.6), low), high)
            starts.append(t)
            ends.append(t + duration)
            t += duration
        k = len(starts)
        episodes.append(
            _Episodes(
                start=starts,
                end=ends,
                intensity=rng.uniform(*config.contention_intensity, size=k).tolist(),
                cpi_exponent=rng.uniform(0.05, 0.9, size=k).tolist(),
                mai_exponent=rng.uniform(0.0, 0.7, size=k).tolist(),
                cpu_exponent=rng.uniform(0.0, 0.4, size=k).tolist(),
                cache_gain=rng.uniform(0.0, 1.2, size=k).tolist(),
            )
        )
    return _Cluster(
        ids=ids,
        speed=speed,
        cpi=rng.lognormal(0.0, 0.2, size=n),
        mai=rng.lognormal(0.0, 0.25, size=n),
        cpi_reveal=rng.uniform(0.15, 0.8, size=n),
        cpu_reveal=rng.uniform(0.0, 0.5, size=n),
        reports_cpi=rng.random(n) >= config.cpi_missing_share,
        episodes=episodes,
    )


@dataclass
class _Job:
    """Job-wide constants: requests for task_events and the scales of every usage column."""

    job_id: int
    user: str
    scheduling_class: int
    priority: int
    cpu_request: float
    memory_request: float
    disk_request: float
    cpu: float
    memory: float
    assigned_ratio: float
    page_cache: float
    disk_io: float
    local_disk: float
    cpi: float
    mai: float


@dataclass
class _Task:
    """A task's own draws: work, the causes attached to the task, and how strongly its features show them."""

    work: float
    skew: float
    hidden: float
    cpu: float
    memory: float
    page_cache: float
    unmapped_share: float
    disk_io: float
    local_disk: float
    cpi: float
    skew_memory: float
    skew_cache: float
    skew_io: float
    skew_disk: float
    penalty_io: float


def _pareto(rng: np.random.Generator, scale: float, alpha: float, cap: float) -> float:
    return float(min(scale * (1.0 + rng.pareto(alpha)), cap))


def _new_job(rng: np.random.Generator, job_id: int) -> _Job:
    cpu_request = float(rng.choice([0.0125, 0.025, 0.03125, 0.0625, 0.125]))
    memory_request = float(rng.uniform(0.005, 0.06))
    return _Job(
        job_id=job_id,
        user=base64.b64encode(rng.bytes(32)).decode(),
        scheduling_class=int(rng.choice([0, 1, 2, 3], p=[0.3, 0.4, 0.25, 0.05])),
        priority=int(rng.choice([0, 1, 2, 4, 9], p=[0.35, 0.15, 0.1, 0.3, 0.1])),
        cpu_request=cpu_request,
        memory_request=memory_request,
        disk_request=float(rng.uniform(1e-4, 2e-3)),
        cpu=cpu_request * float(rng.uniform(0.3, 1.1)),
        memory=memory_request * float(rng.uniform(0.4, 0.95)),
        assigned_ratio=float(rng.uniform(1.02, 1.25)),
        page_cache=float(rng.lognormal(math.log(4e-4), 0.6)),
        disk_io=float(rng.lognormal(math.log(5e-4), 0.8)),
        local_disk=float(rng.lognormal(math.log(4e-5), 0.7)),
        cpi=float(rng.lognormal(math.log(1.3), 0.25)),
        mai=float(rng.lognormal(math.log(4e-3), 0.3)),
    )


def _new_task(
    rng: np.random.Generator, job: _Job, median_work: float, prone: float, config: CausalConfig
) -> _Task:
    skewed = rng.random() < config.skew_share * prone
    hidden = rng.random() < config.hidden_share * prone
    return _Task(
        work=_lognormal(rng, median_work, config.work_sigma),
        skew=_pareto(rng, config.skew_scale, config.skew_alpha, config.tail_cap) if skewed else 1.0,
        hidden=_pareto(rng, config.hidden_scale, config.hidden_alpha, config.tail_cap) if hidden else 1.0,
        cpu=_lognormal(rng, job.cpu, 0.2),
        memory=_lognormal(rng, job.memory, 0.15),
        page_cache=_lognormal(rng, job.page_cache, 0.35),
        unmapped_share=float(rng.uniform(0.02, 0.2)),
        disk_io=_lognormal(rng, job.disk_io, float(rng.uniform(0.3, 0.5))),
        local_disk=_lognormal(rng, job.local_disk, 0.3),
        cpi=_lognormal(rng, 1.0, 0.08),
        skew_memory=float(rng.uniform(0.0, 0.6)),
        skew_cache=float(rng.uniform(0.0, 0.3)),
        skew_io=float(rng.uniform(0.1, 0.9)),
        skew_disk=float(rng.uniform(0.0, 0.7)),
        penalty_io=float(rng.uniform(0.2, 1.0)),
    )


def _window_mean(over: list[tuple[int, float]], quiet: float, span: float, values: list[float]) -> float:
    """Time-weighted mean over a window of a term that is 1 outside episodes and ``values[k]`` in the
    k-th overlapping one."""
    return (quiet + sum(o * v for (_, o), v in zip(over, values, strict=True))) / span


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else ""


def _usage_rows(
    rng: np.random.Generator,
    cluster: _Cluster,
    machine: int,
    job: _Job,
    task_index: int,
    task: _Task,
    attempt: Attempt,
    hang: tuple[float, float] | None,
    penalty: float,
    config: CausalConfig,
) -> Iterator[tuple[int, str]]:
    """The attempt's windows as (start µs, CSV row): cut on the 300 s grid, each the mean over its span."""
    episodes = cluster.episodes[machine]
    speed = float(cluster.speed[machine])
    edges = [attempt.start]
    grid = math.floor(attempt.start / WINDOW_S) * WINDOW_S + WINDOW_S
    while grid < attempt.end:
        edges.append(grid)
        grid += WINDOW_S
    edges.append(attempt.end)
    machine_id = cluster.ids[machine]
    for a, b in itertools.pairwise(edges):
        a_us, b_us = round(a * 1e6), round(b * 1e6)
        if b_us <= a_us or rng.random() < config.window_drop_probability:
            continue
        span = b - a
        over = episodes.overlaps(a, b)
        quiet = span - sum(o for _, o in over)
        c = episodes.intensity
        cpi_term = _window_mean(over, quiet, span, [c[i] ** episodes.cpi_exponent[i] for i, _ in over])
        mai_term = _window_mean(over, quiet, span, [c[i] ** episodes.mai_exponent[i] for i, _ in over])
        cpu_term = _window_mean(over, quiet, span, [c[i] ** -episodes.cpu_exponent[i] for i, _ in over])
        cache_term = _window_mean(
            over, quiet, span, [1.0 + episodes.cache_gain[i] * (c[i] - 1.0) for i, _ in over]
        )
        hung = 0.0 if hang is None else max(0.0, min(b, hang[1]) - max(a, hang[0])) / span
        elapsed = 0.5 * (a + b) - attempt.start

        cpu = (
            task.cpu
            * speed ** cluster.cpu_reveal[machine]
            * ((1.0 - hung) * cpu_term + hung * 0.03)
            * _lognormal(rng, 1.0, 0.12)
        )
        memory = (
            task.memory
            * task.skew**task.skew_memory
            * (0.55 + 0.45 * min(1.0, elapsed / 240.0))
            * _lognormal(rng, 1.0, 0.04)
        )
        total_cache = task.page_cache * task.skew**task.skew_cache * cache_term * _lognormal(rng, 1.0, 0.2)
        io = (
            task.disk_io
            * task.skew**task.skew_io
            * penalty**task.penalty_io
            * (1.0 - 0.95 * hung)
            * _lognormal(rng, 1.0, 0.3)
        )
        if cluster.reports_cpi[machine]:
            cpi = (
                cluster.cpi[machine]
                * job.cpi
                * task.cpi
                * speed ** -cluster.cpi_reveal[machine]
                * cpi_term
                * (1.0 + hung * (_lognormal(rng, 1.8, 0.5) - 1.0))
                * _lognormal(rng, 1.0, 0.08)
            )
            mai = cluster.mai[machine] * job.mai * mai_term * _lognormal(rng, 1.0, 0.12)
        else:
            cpi = mai = math.nan
        values = {
            "mean_cpu_rate": cpu,
            "canonical_memory_usage": memory,
            "assigned_memory_usage": memory * job.assigned_ratio,
            "unmapped_page_cache": total_cache * task.unmapped_share * math.sqrt(cache_term),
            "total_page_cache": total_cache,
            "maximum_memory_usage": memory * float(rng.uniform(1.0, 1.3)),
            "mean_disk_io_time": io,
            "mean_local_disk_space_used": task.local_disk
            * task.skew**task.skew_disk
            * (0.3 + 0.7 * min(1.0, elapsed / 600.0))
            * _lognormal(rng, 1.0, 0.03),
            "maximum_cpu_rate": cpu * float(rng.uniform(1.2, 3.0)),
            "maximum_disk_io_time": io * float(rng.uniform(1.5, 6.0)),
            "cycles_per_instruction": cpi,
            "memory_accesses_per_instruction": mai,
            "sample_portion": 1.0,
            "aggregation_type": 0.0,
            "sampled_cpu_usage": cpu * _lognormal(rng, 1.0, 0.35),
        }
        text = ",".join(
            str(int(values[name])) if name == "aggregation_type" else _fmt(values[name])
            for name in _VALUE_COLUMNS
        )
        yield a_us, f"{a_us},{b_us},{job.job_id},{task_index},{machine_id},{text}"


def _run_attempt(
    episodes: _Episodes,
    t0: float,
    work: float,
    speed: float,
    evict_at: float | None,
    hang_at: float | None,
    hang_s: float,
) -> tuple[float, tuple[float, float] | None, float]:
    """End time, the stall interval (if the attempt stalls before it ends) and the contention factor."""
    t, done, hang = t0, 0.0, None
    target = work if evict_at is None else evict_at * work
    if hang_at is not None and hang_at * work < target:
        t = episodes.advance(t, hang_at * work, speed)
        hang = (t, t + hang_s)
        t, done = t + hang_s, hang_at * work
    end = episodes.advance(t, target - done, speed)
    stalled = 0.0 if hang is None else hang_s
    contention = (end - t0 - stalled) / (target / speed)
    return end, hang, contention


def _simulate_job(
    rng: np.random.Generator,
    cluster: _Cluster,
    job: _Job,
    arrival: float,
    config: CausalConfig,
) -> tuple[list[Attempt], list[tuple[int, int, int, int]], list[tuple[int, str]]]:
    """Attempts, task events (time µs, task, machine or -1, type) and usage rows of one job."""
    n = int(
        min(
            max(round(_lognormal(rng, config.median_tasks, config.task_sigma)), config.min_tasks),
            config.max_tasks,
        )
    )
    waves = int(rng.choice(config.wave_counts, p=np.asarray(config.wave_weights) / sum(config.wave_weights)))
    slots = math.ceil(n / waves)
    median_work = float(math.exp(rng.uniform(*np.log(config.job_median_work_s))))
    prone = float(rng.uniform(*config.job_proneness))  # how prone this job is to skew, hidden, hangs
    free = sorted((arrival + rng.uniform(0.0, 45.0, size=slots)).tolist())
    heapq.heapify(free)
    submit_us = round(arrival * 1e6)
    attempts: list[Attempt] = []
    events: list[tuple[int, int, int, int]] = []
    usage: list[tuple[int, str]] = []
    for index in range(n):
        task = _new_task(rng, job, median_work, prone, config)
        events.append((submit_us, index, -1, SUBMIT))
        t = heapq.heappop(free)
        if index >= slots:
            t += _lognormal(rng, 3.0, 0.8)
        previous, penalty, evictions = -1, 1.0, 0
        while True:
            machine = int(rng.integers(config.machines))
            while machine == previous:
                machine = int(rng.integers(config.machines))
            evicted = rng.random() < config.eviction_probability and evictions < 3
            evict_at = float(rng.uniform(0.05, 0.95)) if evicted else None
            hangs = rng.random() < config.hang_probability * prone
            hang_at = float(rng.uniform(0.05, 0.9)) if hangs else None
            hang_s = min(
                max(_lognormal(rng, config.hang_median_s, 0.7), config.hang_range_s[0]),
                config.hang_range_s[1],
            )
            speed = float(cluster.speed[machine])
            work = task.work * task.skew * task.hidden * penalty
            end, hang, contention = _run_attempt(
                cluster.episodes[machine], t, work, speed, evict_at, hang_at, hang_s
            )
            start_us, end_us = round(t * 1e6), round(end * 1e6)
            if end_us <= start_us:
                end_us = start_us + 1
                end = end_us / 1e6
            stalled = 0.0 if hang is None else hang_s
            attempt = Attempt(
                job_id=job.job_id,
                task=index,
                attempt=evictions,
                machine=cluster.ids[machine],
                start=start_us / 1e6,
                end=end,
                outcome=EVICT if evicted else FINISH,
                factors={
                    "slow_machine": 1.0 / speed,
                    "contention": contention,
                    "input_skew": task.skew,
                    "eviction": penalty,
                    "hidden": task.hidden,
                    "hung": (end - t) / max(end - t - stalled, 1e-9),
                },
            )
            attempts.append(attempt)
            events.append((start_us, index, machine, SCHEDULE))
            events.append((end_us, index, machine, attempt.outcome))
            usage.extend(_usage_rows(rng, cluster, machine, job, index, task, attempt, hang, penalty, config))
            if not evicted:
                attempt.last = True
                heapq.heappush(free, end)
                break
            events.append((end_us, index, -1, SUBMIT))
            evictions += 1
            previous = machine
            penalty = min(max(_lognormal(rng, config.restart_penalty_median, 0.3), 1.05), 4.0)
            t = end + min(max(_lognormal(rng, 45.0, 0.9), 5.0), 900.0)
    return attempts, events, usage


def dominant_cause(factors: dict[str, float]) -> str:
    """The cause with the largest slowdown factor, or "none" when no factor reaches `DOMINANCE_MIN`."""
    cause = max(CAUSES, key=lambda name: factors[name])
    return cause if factors[cause] >= DOMINANCE_MIN else "none"


def straggler_mix(attempts: list[Attempt]) -> tuple[int, dict[str, float]]:
    """How many last runs have latency >= their job's p90, and the share of them per dominant cause."""
    by_job: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        if attempt.last:
            by_job.setdefault(attempt.job_id, []).append(attempt)
    counts = dict.fromkeys((*CAUSES, "none"), 0)
    total = 0
    for runs in by_job.values():
        latency = np.asarray([a.end - a.start for a in runs])
        p90 = float(np.percentile(latency, 90))
        for run, value in zip(runs, latency, strict=True):
            if value >= p90:
                counts[dominant_cause(run.factors)] += 1
                total += 1
    return total, {name: count / max(total, 1) for name, count in counts.items()}


def _write_parts(directory: Path, rows: list[str], parts: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("part-*.csv.gz"):
        old.unlink()
    size = math.ceil(len(rows) / parts) if rows else 0
    for p in range(parts):
        with gzip.GzipFile(directory / f"part-{p:05d}-of-{parts:05d}.csv.gz", "wb", mtime=0) as raw:
            chunk = rows[p * size : (p + 1) * size]
            raw.write("".join(line + "\n" for line in chunk).encode())


def write_causal_usage_trace(
    out_dir: Path, jobs: int, seed: int, *, config: CausalConfig | None = None, parts: int = 4
) -> CausalTraceSummary:
    """Generate ``jobs`` jobs from ``seed`` and write ``task_events/``, ``task_usage/`` and the ground truth.

    Event parts are in time order across files (as the loader reads them); usage parts are ordered by
    window start. The same (jobs, seed, config, parts) writes byte-identical files.
    """
    config = config or CausalConfig()
    out_dir = Path(out_dir)
    root = np.random.SeedSequence(seed)
    cluster_seq, arrival_seq, *job_seqs = root.spawn(2 + jobs)
    arrival_rng = np.random.default_rng(arrival_seq)
    arrivals = TRACE_START_S + 60.0 + np.cumsum(arrival_rng.exponential(config.mean_arrival_gap_s, jobs))
    horizon = float(arrivals.max(initial=TRACE_START_S)) + 48 * 3600.0
    cluster = _make_cluster(np.random.default_rng(cluster_seq), config, horizon)

    attempts: list[Attempt] = []
    event_rows: list[tuple[int, str]] = []
    usage_rows: list[tuple[int, str]] = []
    for j in range(jobs):
        rng = np.random.default_rng(job_seqs[j])
        job = _new_job(rng, JOB_ID_BASE + j)
        job_attempts, events, usage = _simulate_job(rng, cluster, job, float(arrivals[j]), config)
        attempts += job_attempts
        usage_rows += usage
        tail = (
            f"{job.user},{job.scheduling_class},{job.priority},{_fmt(job.cpu_request)},"
            f"{_fmt(job.memory_request)},{_fmt(job.disk_request)},0"
        )
        for time_us, task, machine, kind in events:
            where = "" if machine < 0 else str(cluster.ids[machine])
            event_rows.append((time_us, f"{time_us},,{job.job_id},{task},{where},{kind},{tail}"))

    event_rows.sort(key=lambda row: row[0])  # stable: a task's same-instant events keep their order
    usage_rows.sort(key=lambda row: row[0])
    _write_parts(out_dir / "task_events", [row for _, row in event_rows], parts)
    _write_parts(out_dir / "task_usage", [row for _, row in usage_rows], parts)
    _write_ground_truth(out_dir / GROUND_TRUTH, attempts)
    stragglers, mix = straggler_mix(attempts)
    return CausalTraceSummary(
        out_dir=out_dir,
        jobs=jobs,
        tasks=sum(a.last for a in attempts),
        attempts=len(attempts),
        usage_rows=len(usage_rows),
        stragglers=stragglers,
        mix=mix,
    )


def _write_ground_truth(path: Path, attempts: list[Attempt]) -> None:
    header = "job_id,task_index,attempt,machine_id,start_us,end_us,outcome,last,cause," + ",".join(CAUSES)
    lines = [header]
    for a in attempts:
        factors = ",".join(f"{a.factors[name]:.4f}" for name in CAUSES)
        lines.append(
            f"{a.job_id},{a.task},{a.attempt},{a.machine},{round(a.start * 1e6)},{round(a.end * 1e6)},"
            f"{a.outcome},{int(a.last)},{dominant_cause(a.factors)},{factors}"
        )
    with gzip.GzipFile(path, "wb", mtime=0) as raw:
        raw.write("".join(line + "\n" for line in lines).encode())


def read_ground_truth(trace_dir: Path) -> list[dict[str, str]]:
    """The ground truth rows of a written trace, as dicts of strings keyed by the header."""
    with gzip.open(Path(trace_dir) / GROUND_TRUTH, "rt") as handle:
        header, *lines = handle.read().splitlines()
    names = header.split(",")
    return [dict(zip(names, line.split(","), strict=True)) for line in lines]
