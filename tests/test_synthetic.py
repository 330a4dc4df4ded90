"""The synthetic generator: deterministic, shaped like the brief, honest, and only partly predictable."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import spearmanr

from straggler.core.jobtrace import JobTrace
from straggler.traces.synthetic import (
    FEATURE_NAMES,
    SimulatedJob,
    generate_jobs,
    iter_simulated_jobs,
)


def _small_jobs(n_jobs: int, seed: int) -> list[JobTrace]:
    return generate_jobs(n_jobs, seed=seed, min_tasks=100, max_tasks=600)


@pytest.fixture(scope="module")
def small_jobs() -> list[JobTrace]:
    return _small_jobs(6, 11)


@pytest.fixture(scope="module")
def simulated() -> SimulatedJob:
    return next(iter_simulated_jobs(1, seed=3, min_tasks=400, max_tasks=400))


def _assert_same(a: JobTrace, b: JobTrace) -> None:
    assert a.job_id == b.job_id and a.task_ids == b.task_ids and a.machine_ids == b.machine_ids
    for name in ("start", "end", "finished", "checkpoints", "finish_features"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert len(a.running_index) == len(b.running_index)
    for ia, ib, xa, xb in zip(
        a.running_index, b.running_index, a.running_features, b.running_features, strict=True
    ):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(xa, xb)


def test_same_seed_gives_identical_arrays_and_another_seed_does_not() -> None:
    first = _small_jobs(3, 5)
    again = _small_jobs(3, 5)
    for a, b in zip(first, again, strict=True):
        _assert_same(a, b)
    other = _small_jobs(3, 6)
    assert any(
        a.n_tasks != b.n_tasks or not np.array_equal(a.end, b.end) for a, b in zip(first, other, strict=True)
    )


def test_fewer_jobs_give_a_prefix() -> None:
    few = _small_jobs(2, 5)
    more = _small_jobs(4, 5)
    for a, b in zip(few, more[:2], strict=True):
        _assert_same(a, b)


def test_sizes_stay_within_bounds_and_tasks_all_finish() -> None:
    jobs = generate_jobs(25, seed=2, min_tasks=100, max_tasks=250)
    sizes = np.asarray([job.n_tasks for job in jobs])
    assert sizes.min() >= 100 and sizes.max() <= 250
    assert len(np.unique(sizes)) > 5  # drawn, not constant
    for job in jobs:
        assert job.feature_names == FEATURE_NAMES
        assert job.expected_tasks == job.n_tasks
        assert job.scored.all()
        assert np.all(job.end > job.start)


def test_running_sets_follow_start_and_end(small_jobs: list[JobTrace]) -> None:
    for job in small_jobs:
        assert job.checkpoints[-1] >= job.end.max()
        for t, idx, x in zip(job.checkpoints, job.running_index, job.running_features, strict=True):
            expected = np.flatnonzero((job.start <= t) & (t < job.end))
            np.testing.assert_array_equal(idx, expected)
            assert x.shape == (len(idx), len(FEATURE_NAMES))


def test_tasks_start_in_waves(small_jobs: list[JobTrace]) -> None:
    """When slots are fewer than tasks, later tasks start only as earlier ones end."""
    waved = [job for job in small_jobs if float(job.meta["slots"]) < job.n_tasks]
    assert waved
    for job in waved:
        late = job.start > job.end.min()
        assert late.sum() >= job.n_tasks - float(job.meta["slots"])


def test_latencies_are_heavy_tailed() -> None:
    jobs = _small_jobs(12, 4)
    max_over_median = np.asarray([np.max(job.latency) / np.median(job.latency) for job in jobs])
    p90_over_median = np.asarray([np.percentile(job.latency, 90) / np.median(job.latency) for job in jobs])
    assert max_over_median.max() > 5.0
    assert np.median(max_over_median) > 2.5
    assert np.all(p90_over_median > 1.1)


def test_trace_features_are_features_at_their_own_time(simulated: SimulatedJob) -> None:
    trace = simulated.to_job_trace(checkpoint_seconds=60.0)
    for t, idx, x in zip(trace.checkpoints, trace.running_index, trace.running_features, strict=True):
        np.testing.assert_array_equal(x, simulated.features_at(idx, np.full(len(idx), t)))
    everyone = np.arange(trace.n_tasks)
    np.testing.assert_array_equal(trace.finish_features, simulated.features_at(everyone, trace.end))


def test_telemetry_after_t_does_not_change_features_at_t(simulated: SimulatedJob) -> None:
    t = float(np.median(simulated.start) + np.median(simulated.end - simulated.start) * 0.6)
    running = np.flatnonzero((simulated.start <= t) & (t < simulated.end))
    before = simulated.features_at(running, np.full(len(running), t))

    windows = simulated.windows
    future = windows.end > t
    rng = np.random.default_rng(0)
    values = windows.values.copy()
    values[future] *= rng.uniform(2.0, 10.0, values[future].shape)
    failures = simulated.failures.copy()
    failures[:, -1] = np.where(np.isfinite(failures[:, -1]), failures[:, -1], t + 1.0)  # new late failures
    mutated = dataclasses.replace(
        simulated, windows=dataclasses.replace(windows, values=values), failures=failures
    )

    after = mutated.features_at(running, np.full(len(running), t))
    np.testing.assert_array_equal(after, before)
    later = t + 600.0
    changed = mutated.features_at(running, np.full(len(running), later))
    unchanged = simulated.features_at(running, np.full(len(running), later))
    assert not np.allclose(changed, unchanged, equal_nan=True)  # the mutation is visible once reported


def test_no_feature_tracks_elapsed_time(small_jobs: list[JobTrace]) -> None:
    usage = [i for i, name in enumerate(FEATURE_NAMES) if name not in ("evictions", "failures")]
    for job in small_jobs:
        k = len(job.checkpoints) // 3
        idx, x = job.running_index[k], job.running_features[k]
        elapsed = job.checkpoints[k] - job.start[idx]
        for f in usage:
            ok = np.isfinite(x[:, f])
            if ok.sum() > 30:
                assert abs(spearmanr(x[ok, f], elapsed[ok]).statistic) < 0.5, FEATURE_NAMES[f]


def test_features_explain_latency_only_partly() -> None:
    for job in generate_jobs(5, seed=8, min_tasks=300, max_tasks=1500):
        rho = [
            abs(spearmanr(job.finish_features[:, f], job.latency).statistic)
            for f in range(len(FEATURE_NAMES))
            if np.ptp(job.finish_features[:, f]) > 0
        ]
        assert 0.15 <= max(rho) <= 0.7, (job.job_id, rho)


def test_slow_machines_show_in_the_first_window() -> None:
    jobs = list(iter_simulated_jobs(4, seed=9, min_tasks=1500, max_tasks=3000))
    cpi = FEATURE_NAMES.index("cpi")
    first_cpi, slow = [], []
    for job in jobs:
        tasks = np.arange(job.n_tasks)
        first_end = job.windows.end[np.searchsorted(job.windows.task, tasks)]
        first_cpi.append(job.features_at(tasks, first_end)[:, cpi])
        slow.append(job.slow_factor > 1.0)
    cpi_values, is_slow = np.concatenate(first_cpi), np.concatenate(slow)
    assert 0 < is_slow.sum() < len(is_slow)
    assert np.median(cpi_values[is_slow]) > 1.25 * np.median(cpi_values[~is_slow])


def test_failures_restart_the_task_and_are_counted() -> None:
    jobs = list(iter_simulated_jobs(6, seed=10, min_tasks=1000, max_tasks=3000))
    fl = FEATURE_NAMES.index("failures")
    ev = FEATURE_NAMES.index("evictions")
    slowdown_hit, slowdown_clean = [], []
    for job in jobs:
        trace = job.to_job_trace(60.0)
        np.testing.assert_array_equal(trace.finish_features[:, fl], np.isfinite(job.failures).sum(axis=1))
        np.testing.assert_array_equal(trace.finish_features[:, ev], np.isfinite(job.evictions).sum(axis=1))
        hit = np.isfinite(job.failures).any(axis=1) | np.isfinite(job.evictions).any(axis=1)
        per_work = (job.end - job.start) / job.work
        slowdown_hit.append(per_work[hit])
        slowdown_clean.append(per_work[~hit])
    hit_all, clean_all = np.concatenate(slowdown_hit), np.concatenate(slowdown_clean)
    assert len(hit_all) > 0
    assert np.median(hit_all) > np.median(clean_all)  # lost progress costs time
