"""Seeded synthetic jobs whose stragglers have the causes Mantri measured, seen through noisy telemetry.

Why: the Google task_usage table (~41 GB) is not available here, and a generator lets tests and
benchmarks know why each task straggled. Latency is work / speed integrated over time; each cause
(input skew, slow, busy and degrading machines, remote input, failures, chance) is visible to the
features to a different degree, and the features are the usage windows reported by t
(`straggler.traces.usage`), never elapsed time or progress.

The model, its causes and their visibility: docs/architecture.md, "Synthetic jobs".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from scipy.signal import lfilter

from straggler.core.arrays import FloatArray, IntArray
from straggler.core.jobtrace import JobTrace
from straggler.traces.usage import UsageWindows, assemble_job_trace, features_at

USAGE_FEATURES: tuple[str, ...] = (
    "cpu_usage",
    "max_cpu",
    "memory_usage",
    "disk_io_time",
    "cpi",
    "mem_accesses_per_instr",
    "input_bytes_read_rate",
    "machine_load",
)
EVENT_FEATURES: tuple[str, ...] = ("evictions", "failures")
FEATURE_NAMES: tuple[str, ...] = USAGE_FEATURES + EVENT_FEATURES

_HOUR = 3600.0
_NOISE_SCALE = np.asarray([0.75, 1.0, 0.25, 1.5, 0.75, 1.0, 1.25])
"""Per-window noise of cpu, max cpu, memory, disk I/O, CPI, MAI and read rate, in units of
``telemetry_noise``: memory is a steady level, disk I/O the burstiest."""


@dataclass(frozen=True)
class SyntheticConfig:
    """The cluster and the straggler causes. Ranges ``(lo, hi)`` are drawn once per job (or machine)."""

    median_task_seconds: tuple[float, float] = (120.0, 900.0)
    """A job's typical task duration, log-uniform across jobs."""
    waves: tuple[float, float] = (1.0, 4.0)
    """Tasks per slot, uniform across jobs: 1 runs all tasks at once, 4 runs four after one another."""
    start_stagger: tuple[float, float] = (0.0, 0.3)
    """How long launching the first wave takes, in typical task durations."""
    relaunch_gap_seconds: float = 5.0
    """Mean scheduling delay before a slot starts its next task."""
    usage_window_seconds: float = 15.0
    """Length of a telemetry window (the Google table uses 300 s)."""
    load_period_seconds: float = 60.0
    """Machine load is constant over a period of this length."""

    jitter_sigma: float = 0.2
    """Log-normal per-task noise on work: invisible."""
    tail_probability: tuple[float, float] = (0.01, 0.04)
    """Per job, the share of tasks that draw a Pareto slowdown: invisible."""
    tail_alpha: float = 2.0
    tail_cap: float = 8.0

    skew_sigma: tuple[float, float] = (0.1, 0.45)
    """Per job, the log-normal spread of task input sizes (Mantri's data skew)."""
    hot_partition_probability: float = 0.01
    hot_partition_alpha: float = 2.0
    hot_partition_cap: float = 5.0
    memory_size_exponent: float = 0.4
    """Memory footprint grows like size**exponent: how visible skew is."""
    memory_task_sigma: float = 0.3
    """Per-task memory noise unrelated to size: what hides skew."""

    degrading_machines_per_hour: float = 0.01
    """Per machine and hour, the chance that it starts to degrade (thermal throttling, a failing disk):
    machines change over time. From the onset on it runs ``degrade_factor`` slower; CPI shows it only
    from then on."""
    degrade_factor: tuple[float, float] = (1.5, 3.0)
    remote_read_probability: tuple[float, float] = (0.0, 0.06)
    """Per job, the share of tasks whose input sits on a slow remote store: ``remote_read_factor``
    more time that no metric of the task or its machine shows."""
    remote_read_factor: tuple[float, float] = (1.3, 2.5)
    window_loss: float = 0.05
    """Share of usage windows never reported (a monitoring agent's gaps)."""

    slow_machine_fraction: float = 0.03
    slow_machine_factor: tuple[float, float] = (1.5, 3.0)
    platform_speed: tuple[float, ...] = (1.0, 1.1, 1.25)
    platform_cpi: tuple[float, ...] = (1.0, 1.2, 1.5)
    platform_share: tuple[float, ...] = (0.5, 0.35, 0.15)

    base_load: tuple[float, float] = (2.0, 6.0)
    """Beta(a, b) parameters of a machine's base load (mean 0.25)."""
    load_wander_sigma: float = 0.1
    load_wander_persistence: float = 0.9
    busy_episodes_per_hour: float = 0.25
    busy_episode_seconds: float = 900.0
    busy_extra_load: float = 0.7
    colocation_load: float = 0.15
    """Extra load per other slot of the same job on the machine (Mantri's self-interference)."""
    contention_strength: float = 1.0
    """Slowdown is ``1 + strength × load²``."""

    failures_per_hour: float = 0.02
    flaky_machine_fraction: float = 0.02
    flaky_factor: float = 25.0
    evictions_per_hour_at_full_load: float = 0.1
    restart_delay_seconds: float = 10.0
    eviction_delay_seconds: float = 60.0
    max_interruptions: int = 3

    telemetry_noise: float = 0.2
    """Log-normal sigma of per-window measurement noise (scaled per metric)."""


@dataclass(frozen=True)
class Cluster:
    """Machine properties that persist across jobs (slow hardware, flaky disks, base load)."""

    speed: FloatArray
    """Time multiplier of a machine (1 = nominal; slow machines 1.5–3)."""
    cpi: FloatArray
    failure_rate: FloatArray
    """Failures per second of running."""
    base_load: FloatArray
    slow_factor: FloatArray
    """1 on healthy machines, 1.5–3 on the persistently slow ones."""

    @property
    def n_machines(self) -> int:
        return len(self.speed)


def make_cluster(n_machines: int, config: SyntheticConfig, rng: np.random.Generator) -> Cluster:
    platform = rng.choice(len(config.platform_share), size=n_machines, p=np.asarray(config.platform_share))
    slow = rng.random(n_machines) < config.slow_machine_fraction
    slow_factor = np.where(slow, rng.uniform(*config.slow_machine_factor, size=n_machines), 1.0)
    speed = np.asarray(config.platform_speed)[platform] * slow_factor * rng.lognormal(0.0, 0.05, n_machines)
    flaky = rng.random(n_machines) < config.flaky_machine_fraction
    failure_rate = config.failures_per_hour / _HOUR * np.where(flaky, config.flaky_factor, 1.0)
    return Cluster(
        speed=speed,
        cpi=np.asarray(config.platform_cpi)[platform] * rng.lognormal(0.0, 0.05, n_machines),
        failure_rate=failure_rate,
        base_load=rng.beta(*config.base_load, size=n_machines),
        slow_factor=slow_factor,
    )


@dataclass
class SimulatedJob:
    """A job's ground truth (causes per task) and its telemetry; `to_job_trace` keeps only the latter."""

    job_id: str
    machine: IntArray
    """Cluster machine of each task."""
    start: FloatArray
    end: FloatArray
    work: FloatArray
    size: FloatArray
    tail: FloatArray
    speed: FloatArray
    """Time multiplier of each task's machine (platform × slow hardware)."""
    slow_factor: FloatArray
    """The slow-hardware part of ``speed``: 1 on healthy machines."""
    windows: UsageWindows
    evictions: FloatArray
    """(n_tasks, max_interruptions) eviction times, +inf padded."""
    failures: FloatArray
    meta: dict[str, float | str] = field(default_factory=dict)

    @property
    def n_tasks(self) -> int:
        return len(self.start)

    def features_at(self, tasks: IntArray, times: FloatArray) -> FloatArray:
        """Feature rows of ``tasks`` as seen at ``times``: from windows ended and events before then."""
        return features_at(self.windows, (self.evictions, self.failures), tasks, times)

    def to_job_trace(self, checkpoint_seconds: float) -> JobTrace:
        return assemble_job_trace(
            job_id=self.job_id,
            task_ids=[str(i) for i in range(self.n_tasks)],
            machine_ids=[f"m{m:05d}" for m in self.machine],
            start=self.start,
            end=self.end,
            finished=np.ones(self.n_tasks, dtype=bool),
            windows=self.windows,
            event_times=(self.evictions, self.failures),
            feature_names=FEATURE_NAMES,
            checkpoint_seconds=checkpoint_seconds,
            meta=self.meta,
        )


class _MachineTimeline:
    """Load and progress rate of a job's machines per load period, and the inverse: when work is done.

    Beyond the horizon the last period's rate holds, so very long tails still have a finish time.
    """

    def __init__(self, rate: FloatArray, load: FloatArray, period: float) -> None:
        self.rate, self.load, self.period = rate, load, period
        n_rows = rate.shape[0]
        self.cumulative = np.hstack([np.zeros((n_rows, 1)), np.cumsum(rate * period, axis=1)])
        stride = float(self.cumulative[:, -1].max()) + 1.0
        self._offset = np.arange(n_rows) * stride
        self._flat = (self.cumulative + self._offset[:, None]).ravel()

    def column(self, rel_time: FloatArray) -> IntArray:
        return np.clip((rel_time // self.period).astype(np.int64), 0, self.rate.shape[1] - 1)

    def progress(self, row: IntArray, rel_time: FloatArray) -> FloatArray:
        col = self.column(rel_time)
        return self.cumulative[row, col] + self.rate[row, col] * (rel_time - col * self.period)

    def time_of(self, row: IntArray, progress: FloatArray) -> FloatArray:
        n_cols = self.rate.shape[1]
        pos = np.searchsorted(self._flat, progress + self._offset[row], side="right") - 1
        col = np.clip(pos - row * (n_cols + 1), 0, n_cols - 1)
        return col * self.period + (progress - self.cumulative[row, col]) / self.rate[row, col]


def _machine_loads(
    base: FloatArray, colocated: FloatArray, n_cols: int, config: SyntheticConfig, rng: np.random.Generator
) -> FloatArray:
    """Per machine and period: base + AR(1) wander + busy episodes + own co-located slots."""
    n_rows, period = len(base), config.load_period_seconds
    phi, sigma = config.load_wander_persistence, config.load_wander_sigma
    shocks = rng.normal(0.0, sigma * np.sqrt(1 - phi**2), (n_rows, n_cols))
    shocks[:, 0] = rng.normal(0.0, sigma, n_rows)  # start in the stationary distribution
    wander = lfilter([1.0], [1.0, -phi], shocks, axis=1)

    horizon = n_cols * period
    episodes = rng.poisson(
        config.busy_episodes_per_hour * (horizon + config.busy_episode_seconds) / _HOUR, n_rows
    )
    owner = np.repeat(np.arange(n_rows), episodes)
    begin = rng.uniform(-config.busy_episode_seconds, horizon, len(owner))
    finish = begin + rng.exponential(config.busy_episode_seconds, len(owner))
    edges = np.zeros((n_rows, n_cols + 1))
    np.add.at(edges, (owner, np.clip(np.floor(begin / period).astype(np.int64), 0, n_cols)), 1.0)
    np.add.at(edges, (owner, np.clip(np.ceil(finish / period).astype(np.int64), 0, n_cols)), -1.0)
    busy = np.cumsum(edges, axis=1)[:, :n_cols] > 0.5

    load = base[:, None] + wander + config.busy_extra_load * busy + colocated[:, None]
    return np.clip(load, 0.0, 1.5)


def _degradation(n_rows: int, n_cols: int, config: SyntheticConfig, rng: np.random.Generator) -> FloatArray:
    """Per machine and load period, the slowdown of machines that start to degrade during the job."""
    horizon_hours = n_cols * config.load_period_seconds / _HOUR
    degrading = rng.random(n_rows) < 1.0 - np.exp(-config.degrading_machines_per_hour * horizon_hours)
    onset = rng.integers(0, n_cols, n_rows)
    factor = rng.uniform(*config.degrade_factor, size=n_rows)
    after = np.arange(n_cols)[None, :] >= onset[:, None]
    return np.where(degrading[:, None] & after, factor[:, None], 1.0)


def _task_sizes(n: int, sigma: float, config: SyntheticConfig, rng: np.random.Generator) -> FloatArray:
    size = rng.lognormal(0.0, sigma, n)
    hot = rng.random(n) < config.hot_partition_probability
    size[hot] *= np.minimum(
        1.0 + rng.pareto(config.hot_partition_alpha, int(hot.sum())), config.hot_partition_cap
    )
    return size / np.median(size)


def _grid_windows(
    start: FloatArray, end: FloatArray, width: float
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Each task's run cut at the global grid k × width: (task, window start, window end)."""
    first_boundary = np.floor(start / width).astype(np.int64) + 1
    last_boundary = np.ceil(end / width).astype(np.int64) - 1
    n_boundaries = np.maximum(last_boundary - first_boundary + 1, 0)
    n_windows = n_boundaries + 1
    task = np.repeat(np.arange(len(start)), n_windows)
    offsets = np.concatenate([[0], np.cumsum(n_windows)[:-1]])
    position = np.arange(len(task)) - offsets[task]
    k = first_boundary[task] + position
    win_start = np.where(position == 0, start[task], (k - 1) * width)
    win_end = np.where(position == n_boundaries[task], end[task], k * width)
    return task, win_start, win_end


def simulate_job(
    job_id: str,
    n_tasks: int,
    t0: float,
    cluster: Cluster,
    config: SyntheticConfig,
    rng: np.random.Generator,
) -> SimulatedJob:
    """Run one job on the cluster: waves of tasks, interruptions, then telemetry windows."""
    median = float(np.exp(rng.uniform(*np.log(config.median_task_seconds))))
    waves = float(rng.uniform(*config.waves))
    n_slots = max(1, int(np.ceil(n_tasks / waves)))
    n_waves = int(np.ceil(n_tasks / n_slots))
    stagger = float(rng.uniform(*config.start_stagger)) * median
    skew_sigma = float(rng.uniform(*config.skew_sigma))
    tail_probability = float(rng.uniform(*config.tail_probability))

    # Slots live on machines drawn from the cluster; a machine may host several of the job's slots.
    slot_machine = rng.integers(0, cluster.n_machines, n_slots)
    machines, slot_row, slots_per_machine = np.unique(slot_machine, return_inverse=True, return_counts=True)
    period = config.load_period_seconds
    n_cols = int(np.ceil((stagger + n_waves * median * 5.0) / period)) + 2
    colocated = config.colocation_load * (slots_per_machine - 1.0).astype(np.float64)
    load = _machine_loads(cluster.base_load[machines], colocated, n_cols, config, rng)
    degrade = _degradation(len(machines), n_cols, config, rng)
    slowdown = cluster.speed[machines][:, None] * degrade * (1.0 + config.contention_strength * load**2)
    timeline = _MachineTimeline(1.0 / slowdown, load, period)

    # Work per task: size (skew) × jitter × tail, all fixed before the task starts.
    size = _task_sizes(n_tasks, skew_sigma, config, rng)
    tail = np.ones(n_tasks)
    tailed = rng.random(n_tasks) < tail_probability
    tail[tailed] = np.minimum(1.0 + rng.pareto(config.tail_alpha, int(tailed.sum())), config.tail_cap)
    remote = rng.random(n_tasks) < float(rng.uniform(*config.remote_read_probability))
    hidden = np.where(remote, rng.uniform(*config.remote_read_factor, size=n_tasks), 1.0)
    work = median * size * rng.lognormal(0.0, config.jitter_sigma, n_tasks) * tail * hidden

    # Task order q → slot q % n_slots, wave q // n_slots; a wave starts when the slot frees up.
    order = rng.permutation(n_tasks)
    row = np.empty(n_tasks, dtype=np.int64)
    start = np.empty(n_tasks)
    end = np.empty(n_tasks)
    evictions = np.full((n_tasks, config.max_interruptions), np.inf)
    failures = np.full((n_tasks, config.max_interruptions), np.inf)
    slot_free = rng.uniform(0.0, stagger, n_slots) if stagger > 0 else np.zeros(n_slots)
    for wave in range(n_waves):
        tasks = order[wave * n_slots : (wave + 1) * n_slots]
        slots = np.arange(len(tasks))
        begin = slot_free[slots] + (rng.exponential(config.relaunch_gap_seconds, len(tasks)) if wave else 0.0)
        rows = slot_row[slots]
        finish = _run_with_interruptions(
            tasks,
            rows,
            begin,
            work[tasks],
            timeline,
            cluster.failure_rate[machines[rows]],
            evictions,
            failures,
            config,
            rng,
        )
        row[tasks], start[tasks], end[tasks] = rows, begin, finish
        slot_free[slots] = finish

    windows = _telemetry(row, start, end, size, timeline, cluster, machines, degrade, config, rng, t0)
    return SimulatedJob(
        job_id=job_id,
        machine=machines[row].astype(np.int64),
        start=start + t0,
        end=end + t0,
        work=work,
        size=size,
        tail=tail,
        speed=cluster.speed[machines[row]],
        slow_factor=cluster.slow_factor[machines[row]],
        windows=windows,
        evictions=evictions + t0,
        failures=failures + t0,
        meta={
            "source": "synthetic",
            "median_task_seconds": median,
            "waves": waves,
            "slots": float(n_slots),
            "skew_sigma": skew_sigma,
            "tail_probability": tail_probability,
        },
    )


def _run_with_interruptions(
    tasks: IntArray,
    rows: IntArray,
    begin: FloatArray,
    work: FloatArray,
    timeline: _MachineTimeline,
    failure_rate: FloatArray,
    evictions: FloatArray,
    failures: FloatArray,
    config: SyntheticConfig,
    rng: np.random.Generator,
) -> FloatArray:
    """Finish times; a failure or eviction before the finish restarts the task from scratch."""
    attempt_start = begin.copy()
    finish = timeline.time_of(rows, timeline.progress(rows, attempt_start) + work)
    # Borg preempts tasks on loaded machines: eviction hazard grows with the machine's load.
    mean_load = np.clip(timeline.load[rows].mean(axis=1), 0.0, 1.0)
    hazard = failure_rate + config.evictions_per_hour_at_full_load / _HOUR * mean_load**2
    for k in range(config.max_interruptions):
        wait = rng.exponential(1.0, len(rows)) / hazard
        hit = attempt_start + wait < finish
        if not hit.any():
            break
        when = attempt_start[hit] + wait[hit]
        is_failure = rng.random(int(hit.sum())) < failure_rate[hit] / hazard[hit]
        failures[tasks[hit][is_failure], k] = when[is_failure]
        evictions[tasks[hit][~is_failure], k] = when[~is_failure]
        delay_mean = np.where(is_failure, config.restart_delay_seconds, config.eviction_delay_seconds)
        attempt_start[hit] = when + rng.exponential(1.0, len(when)) * delay_mean
        finish[hit] = timeline.time_of(
            rows[hit], timeline.progress(rows[hit], attempt_start[hit]) + work[hit]
        )
    return finish


def _telemetry(
    row: IntArray,
    start: FloatArray,
    end: FloatArray,
    size: FloatArray,
    timeline: _MachineTimeline,
    cluster: Cluster,
    machines: IntArray,
    degrade: FloatArray,
    config: SyntheticConfig,
    rng: np.random.Generator,
    t0: float,
) -> UsageWindows:
    """Per-window usage: each value depends on the task's fixed traits and its machine in that window."""
    n = len(row)
    task, win_start, win_end = _grid_windows(start + t0, end + t0, config.usage_window_seconds)
    mid = 0.5 * (win_start + win_end) - t0
    r = row[task]
    col = timeline.column(mid)
    load = timeline.load[r, col]
    rate = timeline.rate[r, col]
    contention = 1.0 + config.contention_strength * load**2

    # Job-level levels (each job has its own profile), then per-task traits fixed for the task's life.
    cpu_job, mem_job, io_job, mai_job, read_job = rng.lognormal(0.0, 0.5, 5) * [0.3, 0.05, 0.01, 0.005, 2e6]
    cpu_task = rng.lognormal(0.0, 0.15, n)[task]
    memory_task = rng.lognormal(0.0, config.memory_task_sigma, n)[task]
    io_task = rng.lognormal(0.0, 0.4, n)[task]
    cpi_task = rng.lognormal(0.0, 0.1, n)[task]
    mai_task = rng.lognormal(0.0, 0.3, n)[task]
    bytes_per_work = rng.lognormal(0.0, 0.35, n)[task]
    noise = np.exp(rng.normal(0.0, config.telemetry_noise, (len(task), len(_NOISE_SCALE))) * _NOISE_SCALE)

    cpu = cpu_job * cpu_task / np.sqrt(contention) * noise[:, 0]
    values = np.column_stack(
        [
            cpu,
            cpu * (1.2 + 0.6 * load) * noise[:, 1],
            mem_job * size[task] ** config.memory_size_exponent * memory_task * noise[:, 2],
            io_job * io_task * (1.0 + load) * noise[:, 3],
            cluster.cpi[machines[r]]
            * (cluster.slow_factor[machines[r]] * degrade[r, col]) ** 0.7
            * (1.0 + 0.4 * load)
            * cpi_task
            * noise[:, 4],
            mai_job * size[task] ** 0.15 * mai_task * noise[:, 5],
            read_job * bytes_per_work * rate * noise[:, 6],
            np.maximum(load + rng.normal(0.0, 0.1, len(task)), 0.0),
        ]
    )
    reported = rng.random(len(task)) >= config.window_loss
    return UsageWindows.from_unsorted(
        task[reported], win_start[reported], win_end[reported], values[reported]
    )


def generate_jobs(
    n_jobs: int,
    *,
    seed: int,
    min_tasks: int = 100,
    max_tasks: int = 5000,
    checkpoint_seconds: float = 60.0,
    n_machines: int = 10_000,
    config: SyntheticConfig | None = None,
) -> list[JobTrace]:
    """``n_jobs`` synthetic jobs on one cluster. Job j depends only on (seed, j), so a smaller
    ``n_jobs`` yields a prefix of a larger one."""
    jobs = iter_simulated_jobs(
        n_jobs, seed=seed, min_tasks=min_tasks, max_tasks=max_tasks, n_machines=n_machines, config=config
    )
    return [job.to_job_trace(checkpoint_seconds) for job in jobs]  # one job's telemetry alive at a time


def iter_simulated_jobs(
    n_jobs: int,
    *,
    seed: int,
    min_tasks: int = 100,
    max_tasks: int = 5000,
    n_machines: int = 10_000,
    config: SyntheticConfig | None = None,
) -> Iterator[SimulatedJob]:
    """The jobs of `generate_jobs` with their ground truth (why each task was slow), one at a time, so
    a long run never holds every job's telemetry."""
    if not 1 <= min_tasks <= max_tasks:
        raise ValueError(f"need 1 <= min_tasks <= max_tasks, got {min_tasks}, {max_tasks}")
    config = config or SyntheticConfig()
    cluster_seed, jobs_seed = np.random.SeedSequence(seed).spawn(2)
    cluster = make_cluster(n_machines, config, np.random.default_rng(cluster_seed))
    for j, job_seed in enumerate(jobs_seed.spawn(n_jobs)):
        rng = np.random.default_rng(job_seed)
        log_size = rng.uniform(np.log(min_tasks), np.log(max_tasks))
        n_tasks = int(np.clip(round(np.exp(log_size)), min_tasks, max_tasks))
        t0 = j * _HOUR + float(rng.uniform(0.0, 600.0))
        yield simulate_job(f"synthetic-{seed}-{j}", n_tasks, t0, cluster, config, rng)
