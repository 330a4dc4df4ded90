"""A job's task-latency survival curve while it runs: finished tasks are events, running ones censored.

`kaplan_meier` is the plain estimator. `LatencySurvival` wraps it for decisions: it evaluates S(x) at
any latency, extends the curve past the last finished latency with an exponential tail (Kaplan-Meier
says nothing there, yet a task that has outrun every finished one needs a remaining-time estimate),
and gives the distribution of a running task's remaining time, optionally with a lower bound on its
latency from a predictor (a flag says "latency >= threshold").
"""

from __future__ import annotations

import numpy as np

from straggler.core.arrays import FloatArray


def kaplan_meier(durations: FloatArray, observed: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Event times and survival S(t) just after each, with right-censoring (``observed`` = 1 for events)."""
    order = np.lexsort((-observed, durations))  # at ties, events before censorings
    d = durations[order]
    e = observed[order].astype(bool)
    at_risk = len(d) - np.arange(len(d))
    factors = np.where(e, 1.0 - 1.0 / at_risk, 1.0)
    survival = np.cumprod(factors)
    return d[e], survival[e]


class LatencySurvival:
    """S(x) = P(latency > x) of a job's tasks, from finished latencies and running tasks' elapsed times.

    Past the last finished latency ``x_last`` the curve continues as ``S(x_last) * exp(-(x - x_last) /
    tail_scale)``, with ``tail_scale`` the mean latency restricted to ``x_last`` (the scale the job
    has shown). Needs at least one finished latency.
    """

    def __init__(self, finished: FloatArray, running_elapsed: FloatArray) -> None:
        finished = np.asarray(finished, dtype=np.float64)
        if len(finished) == 0:
            raise ValueError("a survival curve needs at least one finished latency")
        running_elapsed = np.asarray(running_elapsed, dtype=np.float64)
        durations = np.concatenate([finished, running_elapsed])
        observed = np.concatenate([np.ones(len(finished)), np.zeros(len(running_elapsed))])
        times, survival = kaplan_meier(durations, observed)
        self.times = times
        self.values = survival
        self.last_time = float(times[-1])
        self.last_value = float(survival[-1])
        widths = np.diff(np.concatenate([[0.0], times]))
        restricted_mean = float(np.sum(widths * np.concatenate([[1.0], survival[:-1]])))
        self.tail_scale = max(restricted_mean, 1e-9)

    def sf(self, x: FloatArray) -> FloatArray:
        """S(x), elementwise (right-continuous steps, then the exponential tail)."""
        x = np.asarray(x, dtype=np.float64)
        index = np.searchsorted(self.times, x, side="right")
        inside = np.where(index > 0, self.values[np.maximum(index - 1, 0)], 1.0)
        tail = self.last_value * np.exp(-np.maximum(x - self.last_time, 0.0) / self.tail_scale)
        return np.where(x > self.last_time, tail, inside)

    def mean(self) -> float:
        """Mean latency under the curve (restricted part plus the tail's)."""
        return self.tail_scale + self.last_value * self.tail_scale

    def remaining_cdf(self, elapsed: FloatArray, at_least: FloatArray, grid: FloatArray) -> FloatArray:
        """P(remaining <= r) for each task (rows) at each ``grid`` r (columns).

        A task that has run ``elapsed`` and whose latency is known to be at least ``at_least`` (>=
        elapsed; a predictor's flag) has latency distributed as S conditioned on L > at_least.
        """
        elapsed = np.asarray(elapsed, dtype=np.float64)[:, None]
        bound = np.maximum(np.asarray(at_least, dtype=np.float64)[:, None], elapsed)
        base = self.sf(bound)
        latency = elapsed + grid[None, :]
        ratio = self.sf(latency) / np.maximum(base, 1e-300)
        cdf = np.where(latency < bound, 0.0, 1.0 - np.minimum(ratio, 1.0))
        # Where the curve has no mass left past ``bound``, fall back on the tail's shape from there.
        dead = base[:, 0] <= 1e-12
        if dead.any():
            cdf[dead] = 1.0 - np.exp(-np.maximum(latency[dead] - bound[dead], 0.0) / self.tail_scale)
        return np.asarray(cdf, dtype=np.float64)

    def fresh_cdf(self, grid: FloatArray) -> FloatArray:
        """P(a fresh copy's latency <= r) at each ``grid`` r."""
        return np.asarray(1.0 - self.sf(grid), dtype=np.float64)
