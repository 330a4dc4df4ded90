"""Straggler thresholds: the oracle p90 of a job's latencies, and an online estimate of it.

The empirical p90 of the finished tasks is biased low while a job runs: the slow tasks are exactly
the ones that have not finished. The online estimate treats running tasks as right-censored at their
elapsed time:

- Kaplan-Meier gives the exact p90 of the tasks started so far as soon as it is identifiable (the
  survival curve has dropped to 1 - q on finished latencies);
- before that, a log-normal fitted by censored maximum likelihood extrapolates the tail, and the
  estimate is never below the largest latency the data already proves to be under the p90
  (the point where Kaplan-Meier is still above 1 - q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from straggler.core.arrays import FloatArray
from straggler.core.survival import kaplan_meier


def oracle_threshold(latencies: FloatArray, quantile: float = 0.9) -> float:
    """The paper's threshold: the job's true p90 latency (future information: evaluation only)."""
    values = latencies[np.isfinite(latencies)]
    if len(values) == 0:
        raise ValueError("no latency to take a quantile of")
    return float(np.quantile(values, quantile))


_LOG_SQRT_2PI = np.log(np.sqrt(2 * np.pi))
"""As `scipy.stats.norm` has it."""


def _normal_logpdf(x: FloatArray, mu: float, sigma: float) -> FloatArray:
    """``scipy.stats.norm.logpdf(x, mu, sigma)`` bit for bit, without its argument checks (the
    optimiser calls it for every step): the same operations, in the same order, where every ``x`` is
    finite and ``sigma`` is; scipy's own otherwise."""
    z = np.asarray((x - mu) / sigma, dtype=np.float64)
    if not (np.isfinite(sigma) and sigma > 0 and np.isfinite(z).all()):
        return np.asarray(stats.norm.logpdf(x, mu, sigma), dtype=np.float64)
    return -(z**2) / 2.0 - _LOG_SQRT_2PI - np.log(np.full(len(z), sigma))


def censored_lognormal(finished: FloatArray, censored: FloatArray) -> tuple[float, float]:
    """(mu, sigma) of log latency: a log-normal fitted by maximum likelihood to ``finished``
    latencies and right-censored ``censored`` ones (running tasks' elapsed times)."""
    y = np.log(np.maximum(finished, 1e-3))
    c = np.log(np.maximum(censored, 1e-3))
    mu0 = float(np.mean(np.r_[y, c])) if len(y) + len(c) else 0.0
    sd0 = float(np.std(np.r_[y, c])) or 1.0

    def nll(params: FloatArray) -> float:
        mu, log_sigma = params
        sigma = np.exp(log_sigma)
        ll = np.sum(_normal_logpdf(y, mu, sigma)) if len(y) else 0.0
        if len(c):
            ll += np.sum(special.log_ndtr(-(c - mu) / sigma))
        return -float(ll)

    result = optimize.minimize(
        nll,
        x0=np.array([mu0, np.log(sd0)]),
        method="L-BFGS-B",
        bounds=[(None, None), (np.log(1e-3), np.log(50.0))],
    )
    mu, log_sigma = result.x
    return float(mu), float(np.exp(log_sigma))


def _lognormal_censored_quantile(finished: FloatArray, censored: FloatArray, quantile: float) -> float:
    """Quantile of a log-normal fitted by maximum likelihood with right-censored observations."""
    mu, sigma = censored_lognormal(finished, censored)
    return float(np.exp(mu + sigma * stats.norm.ppf(quantile)))


@dataclass(frozen=True)
class ThresholdEstimate:
    value: float
    identified: bool
    """True when Kaplan-Meier alone pins the quantile (no extrapolation)."""


def online_threshold(
    finished_latency: FloatArray, running_elapsed: FloatArray, quantile: float = 0.9
) -> ThresholdEstimate:
    """Censoring-aware estimate of the job's latency quantile from what a checkpoint shows."""
    if len(finished_latency) == 0:
        return ThresholdEstimate(float("inf"), False)
    durations = np.concatenate([finished_latency, running_elapsed]).astype(np.float64)
    observed = np.concatenate([np.ones(len(finished_latency)), np.zeros(len(running_elapsed))])
    times, survival = kaplan_meier(durations, observed)
    below = np.flatnonzero(survival <= 1.0 - quantile + 1e-12)
    if len(below):
        return ThresholdEstimate(float(times[below[0]]), True)
    lower_bound = float(times[-1]) if len(times) else 0.0
    fitted = _lognormal_censored_quantile(finished_latency, running_elapsed, quantile)
    return ThresholdEstimate(max(fitted, lower_bound), False)
