"""The policy that waits for the next verdict, as tried on commit 2439fb2 (not shipped).

Scratch harness, kept so that the table of docs/results.md §11 ("Waiting for the next verdict") can
be re-run: from the repository root,

    DOCS=docs/results/decision-layer/variants
    WAIT=1 OMP_NUM_THREADS=1 .venv/bin/python $DOCS/wait_variants.py evaluate --format synthetic \
        --jobs 40 --seed 0 --threshold online --checkpoint-seconds 60 \
        --methods nurd,reactive,preq-s35 --policies speculate --workers 1 --out DIR

With ``WAIT=1``, `Speculate.plan` drops from its copies those whose value now is below the expected
value of deciding at the next checkpoint with the next verdict known: E[max(value later, 0)] over
the next mean log-odds, normal with the job's pooled verdict spread over n + 1 (three-point
Gauss-Hermite), each copy valued alone; a copy made later starts a checkpoint interval later, and
only if the task still runs. The presets are `spacing_variants.py`'s plus ``preq-s60``, ``-s75``,
``-s100`` (`SurvivalGate(shrink=...)`), and `prior_variants.py`'s (``bold-B``: waiting with a bolder
`nurd`, at HEAD after fce7847; the runs named ``*-bold-*`` in ``wait/``).
"""

import math
import os
import sys

import numpy as np

from straggler.core import nurd
from straggler.core import speculation as sp
from straggler.core.survival import LatencySurvival

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prior_variants  # noqa: F401 (its presets: the `bold-B` ones)
import spacing_variants  # its presets

DEFAULT_SPREAD = 1.0
GAUSS_HERMITE = [(-math.sqrt(3.0), 1 / 6), (0.0, 2 / 3), (math.sqrt(3.0), 1 / 6)]

for shrink in (60, 75, 100):
    nurd.PRESETS[f"preq-s{shrink}"] = spacing_variants.preset(
        lambda shrink=shrink: nurd.SurvivalGate(shrink=shrink / 100)
    )

_weigh = sp._weigh_verdict


def weigh_verdict(running, previous, probability):
    """The shipped mean of log-odds, and the sum of their squares for the spread."""
    _weigh(running, previous, probability)
    p = min(max(probability, 1e-4), 1.0 - 1e-4)
    log_odds = math.log(p / (1 - p))
    running.sq = getattr(previous, "sq", 0.0) + log_odds * log_odds


def pooled_spread(job):
    squares = freedom = 0.0
    for r in job.running.values():
        if r.verdicts >= 2:
            squares += getattr(r, "sq", 0.0) - r.log_odds**2 / r.verdicts
            freedom += r.verdicts - 1
    return math.sqrt(max(squares / freedom, 1e-6)) if freedom >= 5 else DEFAULT_SPREAD


def expit(x):
    return 1.0 / (1.0 + math.exp(-x))


_plan = sp.Speculate.plan


def plan(self, job, at):
    chosen = _plan(self, job, at)
    if not chosen.tasks:
        return chosen
    est = sp._estimate(job, at, self.grid_points, self.stuck_prior)
    rows = {t: i for i, t in enumerate(est.ids)}
    elapsed = np.array([at - job.running[t].start for t in est.ids])
    finished = np.fromiter(job.finished.values(), dtype=np.float64)
    survival = LatencySurvival(finished, elapsed, self.stuck_prior)
    grid, step, interval = est.grid, est.step, self.checkpoint_interval
    later_fresh = np.interp(grid - interval, grid, est.fresh, left=0.0)
    spread = pooled_spread(job)
    keep = []
    for t in chosen.tasks:
        r, i = job.running[t], rows[t]
        bound = max(r.at_least, elapsed[i])
        if math.isnan(r.probability) or not r.threshold > bound:
            keep.append(t)
            continue
        e, b, thr = elapsed[i : i + 1], np.array([bound]), np.array([r.threshold])
        high = survival._beyond(e, np.maximum(thr, b), grid)[0]
        low = survival._between(e, b, thr, grid)[0]
        others = est.all_done - est.log_cdf[i]

        def value(p, later, high=high, low=low, others=others):
            remaining = p * high + (1 - p) * low
            tail = 1.0 - remaining
            base = np.sum(1.0 - np.exp(others + np.log(np.maximum(remaining, 1e-300)))) * step
            fresh = later_fresh if later else est.fresh
            with_copy = 1.0 - tail * (1.0 - fresh)
            end = np.sum(1.0 - np.exp(others + np.log(np.maximum(with_copy, 1e-300)))) * step
            gain = np.sum(tail * fresh) * step
            started = (grid >= interval) if later else 1.0
            copy_time = np.sum(tail * (1.0 - fresh) * started) * step
            overrun = 0.5 * interval * (float(np.interp(interval, grid, tail)) if later else 1.0)
            extra = copy_time - gain + overrun
            return (base - end) / est.completion - self.machine_price * extra / est.work

        mean = r.log_odds / r.verdicts
        wait = sum(
            w * max(value(expit(mean + z * spread / (r.verdicts + 1)), True), 0.0) for z, w in GAUSS_HERMITE
        )
        if value(r.probability, False) >= wait:
            keep.append(t)
    if len(keep) == len(chosen.tasks):
        return chosen
    share = len(keep) / len(chosen.tasks)  # pro-rated: the reason text and the budget's tally
    return sp.CopyPlan(keep, chosen.saving * share, chosen.extra * share, chosen.completion, chosen.work)


if os.environ.get("WAIT"):
    sp._weigh_verdict = weigh_verdict
    sp.Speculate.plan = plan

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
