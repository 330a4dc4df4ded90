"""A job's task-latency survival curve while it runs: finished tasks are events, running ones censored.

`kaplan_meier` is the plain estimator. `LatencySurvival` wraps it for decisions: it evaluates S(x) at
any latency, extends the curve past the last finished latency with an exponential tail (Kaplan-Meier
says nothing there, yet a task that has outrun every finished one needs a remaining-time estimate),
and gives the distribution of a running task's remaining time. Two things refine that distribution:
a predictor's probability that the latency reaches a threshold (a mixture of the curve past it and
below it), and a prior share of stuck attempts that never end by themselves: the exponential tail
alone is memoryless, so a hung task would look "about to finish" at every checkpoint.
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

    def __init__(self, finished: FloatArray, running_elapsed: FloatArray, stuck_prior: float = 0.0) -> None:
        if not 0.0 <= stuck_prior < 1.0:
            raise ValueError(f"stuck_prior must be in [0, 1), got {stuck_prior}")
        self.stuck_prior = stuck_prior
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

    def stuck_probability(self, bound: FloatArray) -> FloatArray:
        """P(the attempt is stuck | its latency exceeds ``bound``): the prior ``stuck_prior`` against the
        normal runs' S(bound). It grows towards 1 as a task outruns the job's body: the memory the
        exponential tail lacks."""
        prior = self.stuck_prior
        if prior <= 0.0:
            return np.zeros_like(np.asarray(bound, dtype=np.float64))
        return np.asarray(prior / (prior + (1.0 - prior) * self.sf(bound)), dtype=np.float64)

    def remaining_cdf(
        self,
        elapsed: FloatArray,
        at_least: FloatArray,
        grid: FloatArray,
        probability: FloatArray | None = None,
        threshold: FloatArray | None = None,
    ) -> FloatArray:
        """P(remaining <= r) for each task (rows) at each ``grid`` r (columns); ``grid`` is one row
        for every task, or a row per task.

        A task that has run ``elapsed`` and whose latency is known to be at least ``at_least`` (>=
        elapsed) has latency distributed as S conditioned on L > at_least, or is stuck (never ends by
        itself, `stuck_probability`). Where a predictor gives ``probability`` = P(L >= ``threshold``)
        (finite), the distribution is the mixture of L > max(threshold, at_least) with that weight and
        of at_least < L < threshold with the rest: a confident prediction moves the whole estimate.
        """
        elapsed = np.asarray(elapsed, dtype=np.float64)
        bound = np.maximum(np.asarray(at_least, dtype=np.float64), elapsed)
        beyond = self._beyond(elapsed, bound, grid)
        if probability is None or threshold is None:
            return beyond
        p = np.asarray(probability, dtype=np.float64)
        thr = np.asarray(threshold, dtype=np.float64)
        has_prediction = np.isfinite(p) & np.isfinite(thr) & (thr > bound)
        if not has_prediction.any():
            return beyond
        rows = np.flatnonzero(has_prediction)
        grid_rows = grid if np.ndim(grid) == 1 else np.asarray(grid)[rows]
        high = self._beyond(elapsed[rows], thr[rows], grid_rows)
        low = self._between(elapsed[rows], bound[rows], thr[rows], grid_rows)
        weight = np.clip(p[rows], 0.0, 1.0)[:, None]
        out = beyond.copy()
        out[rows] = weight * high + (1.0 - weight) * low
        return out

    def _beyond(self, elapsed: FloatArray, bound: FloatArray, grid: FloatArray) -> FloatArray:
        """P(remaining <= r | L > bound), the stuck share never ending."""
        e = elapsed[:, None]
        b = bound[:, None]
        base = self.sf(b)
        latency = e + _rows(grid)
        ratio = self.sf(latency) / np.maximum(base, 1e-300)
        cdf = np.where(latency < b, 0.0, 1.0 - np.minimum(ratio, 1.0))
        # Where the curve has no mass left past ``bound``, fall back on the tail's shape from there.
        dead = base[:, 0] <= 1e-12
        if dead.any():
            cdf[dead] = 1.0 - np.exp(-np.maximum(latency[dead] - b[dead], 0.0) / self.tail_scale)
        normal = 1.0 - self.stuck_probability(bound)[:, None]
        return np.asarray(normal * cdf, dtype=np.float64)

    def _between(
        self, elapsed: FloatArray, low: FloatArray, high: FloatArray, grid: FloatArray
    ) -> FloatArray:
        """P(remaining <= r | low < L <= high) of a normal run (a predictor's "not a straggler")."""
        e = elapsed[:, None]
        s_low = self.sf(low[:, None])
        s_high = self.sf(high[:, None])
        latency = e + _rows(grid)
        mass = s_low - s_high
        with np.errstate(invalid="ignore", divide="ignore"):
            cdf = (s_low - np.maximum(self.sf(latency), s_high)) / mass
        # No mass between the bounds (the curve is flat there): the run ends at the upper bound.
        cdf = np.where(mass > 1e-12, cdf, (latency >= high[:, None]).astype(np.float64))
        cdf = np.where(latency >= high[:, None], 1.0, cdf)
        return np.asarray(np.clip(cdf, 0.0, 1.0), dtype=np.float64)

    def fresh_cdf(self, grid: FloatArray) -> FloatArray:
        """P(a fresh copy's latency <= r) at each ``grid`` r."""
        return np.asarray(1.0 - self.sf(grid), dtype=np.float64)


def _rows(grid: FloatArray) -> FloatArray:
    """``grid`` as rows: one row shared by every task, or already a row per task."""
    grid = np.asarray(grid, dtype=np.float64)
    return grid[None, :] if grid.ndim == 1 else grid
