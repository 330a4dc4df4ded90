"""Online task features derived from a cluster's event stream, each one from the past only.

A trace loader feeds `OnlineFeatureLog` with events in trace-time order; it records every state change
as a step ``(key, time, value after)``, and `OnlineFeatures.at` reads, per step log, the last change
strictly before t: an event at exactly t is never visible at t.

Feature definitions: docs/architecture.md, "Online features from the event stream".
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from straggler.core.arrays import FloatArray, IntArray

FEATURE_NAMES: tuple[str, ...] = (
    "cpu_request",
    "memory_request",
    "disk_request",
    "priority",
    "scheduling_class",
    "different_machine",
    "schedule_delay",
    "own_evictions",
    "own_failures",
    "machine_running_tasks",
    "machine_same_job_tasks",
    "machine_failures_1h",
    "machine_slowness",
    "machine_history",
)
STATIC_FEATURES = FEATURE_NAMES[:6]

SLOWNESS_HISTORY = 20
MIN_PEER_FINISHES = 3
FAILURE_WINDOW_US = 3_600 * 1_000_000
_PAIR_SHIFT = 32  # (machine, job) pair key = machine << 32 | job: both codes stay far below 2**31


class _RunningMedian:
    """Median of a growing multiset in O(log n) per insert (a max-heap below, a min-heap above)."""

    __slots__ = ("high", "low")

    def __init__(self) -> None:
        self.low: list[int] = []  # negated values: a max-heap of the lower half
        self.high: list[int] = []

    def add(self, value: int) -> None:
        if self.low and value > -self.low[0]:
            heapq.heappush(self.high, value)
        else:
            heapq.heappush(self.low, -value)
        if len(self.low) > len(self.high) + 1:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.high) > len(self.low):
            heapq.heappush(self.low, -heapq.heappop(self.high))

    def __len__(self) -> int:
        return len(self.low) + len(self.high)

    def median(self) -> float:
        if len(self.low) > len(self.high):
            return float(-self.low[0])
        return (-self.low[0] + self.high[0]) / 2.0


class _StepAppender:
    """Append-only ``(key, time, values...)`` records, kept compact until the sweep ends."""

    def __init__(self, n_values: int, typecode: str) -> None:
        self.keys = array("q")
        self.times = array("q")
        self.values: list[array[Any]] = [array(typecode) for _ in range(n_values)]

    def freeze(self) -> StepLog:
        keys = np.frombuffer(self.keys, dtype=np.int64).copy()
        times = np.frombuffer(self.times, dtype=np.int64).copy()
        values = [np.asarray(v) for v in self.values]
        return StepLog(keys, times, values)


class StepLog:
    """Step functions of time, one per key; answers "last value strictly before t" in batches."""

    def __init__(self, keys: IntArray, times: IntArray, values: list[NDArray[np.generic]]) -> None:
        # lexsort is stable, so equal-time records of one key keep their order: the last one wins.
        order = np.lexsort((times, keys))
        sorted_keys = keys[order]
        self._unique_keys, starts = np.unique(sorted_keys, return_index=True)
        self._offsets = np.append(starts, len(sorted_keys)).astype(np.int64)
        self._times = times[order]
        self.values = [v[order] for v in values]

    def last_before(self, keys: IntArray, times: IntArray) -> IntArray:
        """For each (key, t), the position in ``values`` of the key's last record with time < t, or -1."""
        slot = np.searchsorted(self._unique_keys, keys)
        slot_ok = slot < len(self._unique_keys)
        slot = np.where(slot_ok, slot, 0)
        known = slot_ok & (self._unique_keys[slot] == keys) if len(self._unique_keys) else slot_ok
        lo = np.where(known, self._offsets[slot], 0)
        hi = np.where(known, self._offsets[np.minimum(slot + 1, len(self._offsets) - 1)], 0)
        first = lo.copy()
        # Vectorised binary search for the first record with time >= t within each key's slice.
        active = np.flatnonzero(lo < hi)
        while len(active):
            mid = (lo[active] + hi[active]) // 2
            go_right = self._times[mid] < times[active]
            lo[active[go_right]] = mid[go_right] + 1
            hi[active[~go_right]] = mid[~go_right]
            active = active[lo[active] < hi[active]]
        return np.where(lo > first, lo - 1, -1)

    def value_before(self, keys: IntArray, times: IntArray, column: int, default: float) -> FloatArray:
        pos = self.last_before(keys, times)
        out = np.full(len(keys), default, dtype=np.float64)
        hit = pos >= 0
        out[hit] = self.values[column][pos[hit]]
        return out


class OnlineFeatureLog:
    """Live cluster state during one chronological sweep, recorded as step logs for later queries.

    Callers must report events in non-decreasing time. Task, job and machine are dense integer codes
    chosen by the loader.
    """

    def __init__(self) -> None:
        self._running: dict[int, int] = {}
        self._pair_running: dict[int, int] = {}
        self._machine_failures: dict[int, int] = {}
        self._evictions: dict[int, int] = {}
        self._failures: dict[int, int] = {}
        self._first_submit: dict[int, int] = {}
        self._job_latency: dict[int, _RunningMedian] = {}
        self._machine_ratios: dict[int, deque[float]] = {}
        self._running_log = _StepAppender(1, "q")
        self._pair_log = _StepAppender(1, "q")
        self._machine_failure_log = _StepAppender(1, "q")
        self._eviction_log = _StepAppender(1, "q")
        self._failure_log = _StepAppender(1, "q")
        self._slowness_log = _StepAppender(2, "d")
        self._static_log = _StepAppender(len(STATIC_FEATURES), "d")

    @staticmethod
    def _append(log: _StepAppender, key: int, t: int, value: int) -> None:
        log.keys.append(key)
        log.times.append(t)
        log.values[0].append(value)

    def submitted(self, task: int, t: int) -> None:
        self._first_submit.setdefault(task, t)

    def static_changed(self, task: int, t: int, values: tuple[float, ...]) -> None:
        log = self._static_log
        log.keys.append(task)
        log.times.append(t)
        for column, value in zip(log.values, values, strict=True):
            column.append(value)

    def run_started(self, task: int, job: int, machine: int, t: int) -> None:
        count = self._running.get(machine, 0) + 1
        self._running[machine] = count
        self._append(self._running_log, machine, t, count)
        pair = (machine << _PAIR_SHIFT) | job
        count = self._pair_running.get(pair, 0) + 1
        self._pair_running[pair] = count
        self._append(self._pair_log, pair, t, count)

    def run_ended(self, task: int, job: int, machine: int, t: int, latency_us: int | None) -> None:
        """A run left its machine; ``latency_us`` only for a FINISH whose SCHEDULE was observed."""
        count = self._running[machine] - 1
        self._running[machine] = count
        self._append(self._running_log, machine, t, count)
        pair = (machine << _PAIR_SHIFT) | job
        count = self._pair_running[pair] - 1
        self._pair_running[pair] = count
        self._append(self._pair_log, pair, t, count)
        if latency_us is None:
            return
        peers = self._job_latency.get(job)
        if peers is None:
            peers = self._job_latency[job] = _RunningMedian()
        peers.add(latency_us)
        median = peers.median()
        if len(peers) < MIN_PEER_FINISHES or median <= 0:
            return
        ratios = self._machine_ratios.get(machine)
        if ratios is None:
            ratios = self._machine_ratios[machine] = deque(maxlen=SLOWNESS_HISTORY)
        ratios.append(latency_us / median)
        log = self._slowness_log
        log.keys.append(machine)
        log.times.append(t)
        ordered = sorted(ratios)
        middle = len(ordered) // 2
        median_ratio = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        log.values[0].append(median_ratio)
        log.values[1].append(float(len(ratios)))

    def task_evicted(self, task: int, t: int) -> None:
        count = self._evictions.get(task, 0) + 1
        self._evictions[task] = count
        self._append(self._eviction_log, task, t, count)

    def task_failed(self, task: int, t: int) -> None:
        count = self._failures.get(task, 0) + 1
        self._failures[task] = count
        self._append(self._failure_log, task, t, count)

    def machine_failure(self, machine: int, t: int) -> None:
        count = self._machine_failures.get(machine, 0) + 1
        self._machine_failures[machine] = count
        self._append(self._machine_failure_log, machine, t, count)

    def freeze(self) -> OnlineFeatures:
        """End the sweep: sort the logs for queries (the live log should be dropped afterwards)."""
        n_submits = len(self._first_submit)
        return OnlineFeatures(
            running=self._running_log.freeze(),
            pair_running=self._pair_log.freeze(),
            machine_failures=self._machine_failure_log.freeze(),
            evictions=self._eviction_log.freeze(),
            failures=self._failure_log.freeze(),
            slowness=self._slowness_log.freeze(),
            static=self._static_log.freeze(),
            submit_tasks=np.fromiter(self._first_submit.keys(), dtype=np.int64, count=n_submits),
            submit_times=np.fromiter(self._first_submit.values(), dtype=np.int64, count=n_submits),
        )


@dataclass
class OnlineFeatures:
    """Frozen step logs of one sweep; `at` evaluates `FEATURE_NAMES` for any (task, time) batch."""

    running: StepLog
    pair_running: StepLog
    machine_failures: StepLog
    evictions: StepLog
    failures: StepLog
    slowness: StepLog
    static: StepLog
    submit_tasks: IntArray
    submit_times: IntArray

    def at(
        self, task: IntArray, job: IntArray, machine: IntArray, run_start_us: IntArray, t_us: IntArray
    ) -> FloatArray:
        """Features of each task at its time t, from records strictly before t (shape (n, d)).

        ``run_start_us`` is the SCHEDULE time of the run being described (it must be <= t).
        """
        task, job, machine = (np.asarray(a, dtype=np.int64) for a in (task, job, machine))
        run_start_us, t_us = np.asarray(run_start_us, np.int64), np.asarray(t_us, np.int64)
        n = len(task)
        out = np.empty((n, len(FEATURE_NAMES)), dtype=np.float64)
        static_pos = self.static.last_before(task, t_us)
        hit = static_pos >= 0
        for column in range(len(STATIC_FEATURES)):
            values = np.full(n, np.nan)
            values[hit] = self.static.values[column][static_pos[hit]]
            out[:, column] = values
        out[:, 6] = self._schedule_delay_s(task, run_start_us)
        out[:, 7] = self.evictions.value_before(task, t_us, 0, 0.0)
        out[:, 8] = self.failures.value_before(task, t_us, 0, 0.0)
        out[:, 9] = self.running.value_before(machine, t_us, 0, 0.0)
        pair = (machine << _PAIR_SHIFT) | job
        out[:, 10] = self.pair_running.value_before(pair, t_us, 0, 0.0)
        since = np.maximum(t_us - FAILURE_WINDOW_US, 0)
        out[:, 11] = self.machine_failures.value_before(
            machine, t_us, 0, 0.0
        ) - self.machine_failures.value_before(machine, since, 0, 0.0)
        slowness_pos = self.slowness.last_before(machine, t_us)
        hit = slowness_pos >= 0
        out[:, 12] = 1.0
        out[hit, 12] = self.slowness.values[0][slowness_pos[hit]]
        out[:, 13] = 0.0
        out[hit, 13] = self.slowness.values[1][slowness_pos[hit]]
        return out

    def _schedule_delay_s(self, task: IntArray, run_start_us: IntArray) -> FloatArray:
        order = np.argsort(self.submit_tasks, kind="stable")
        tasks, times = self.submit_tasks[order], self.submit_times[order]
        slot = np.minimum(np.searchsorted(tasks, task), max(len(tasks) - 1, 0))
        submit = np.full(len(task), -1, dtype=np.int64)
        if len(tasks):
            found = tasks[slot] == task
            submit[found] = times[slot[found]]
        seen = (submit >= 0) & (submit <= run_start_us)
        return np.where(seen, (run_start_us - submit) / 1e6, 0.0)
