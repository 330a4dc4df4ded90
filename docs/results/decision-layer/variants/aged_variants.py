"""A policy that brings each verdict up to date before averaging them (tried, not shipped).

Scratch harness for docs/results.md §11 ("What the blind traces' misses are made of"). The shipped
policy prices a task with the mean log-odds of its attempt's verdicts (`speculation._weigh_verdict`);
an early verdict was given when the task had run e_k, and the task has since run to e_now. With
``AGED=1`` each verdict is first updated by Bayes for that survival, a straggler surviving surely:
l_k' = l_k - log P(L >= e_now | e_k <= L < threshold) under the job's survival curve, then the mean
of the l_k' is the task's probability. From the repository root:

    DOCS=docs/results/decision-layer/variants
    AGED=1 OMP_NUM_THREADS=1 .venv/bin/python $DOCS/aged_variants.py evaluate \
        --format synthetic --jobs 40 --seed 0 --threshold online --checkpoint-seconds 60 \
        --methods nurd,reactive --policies speculate --workers 1 --out DIR
"""

import math
import os
import sys

import numpy as np

from straggler.core import speculation as sp
from straggler.core.survival import LatencySurvival

_clock = {"at": 0.0}  # the checkpoint being weighed (`_weigh_verdict` is not given it)
_weigh_verdict = sp._weigh_verdict
_on_checkpoint = sp.Speculate.on_checkpoint
_plan = sp.Speculate.plan


def weigh_verdict(running, previous, probability):
    """The shipped mean, and each verdict's log-odds with the task's elapsed time when it was given."""
    _weigh_verdict(running, previous, probability)
    p = min(max(probability, 1e-4), 1 - 1e-4)
    given = (math.log(p / (1 - p)), _clock["at"] - running.start)
    running.history = [*getattr(previous, "history", []), given]


def on_checkpoint(self, job_id, at, decisions):
    _clock["at"] = at
    return _on_checkpoint(self, job_id, at, decisions)


def plan(self, job, at):
    """The shipped plan, on probabilities whose verdicts were each brought up to ``at`` first."""
    if job.finished and job.running:
        ids = sorted(job.running)
        elapsed = np.array([at - job.running[t].start for t in ids])
        finished = np.fromiter(job.finished.values(), dtype=np.float64)
        survival = LatencySurvival(finished, elapsed, self.stuck_prior)
        for task_id, now in zip(ids, elapsed, strict=True):
            running = job.running[task_id]
            history = getattr(running, "history", None)
            if not history or not math.isfinite(running.threshold) or running.threshold <= now:
                continue
            at_threshold, at_now = survival.sf(np.array([running.threshold, now]))
            log_odds, then = np.array(history).T
            mass = survival.sf(then) - at_threshold  # P(then <= L < threshold)
            kept = np.where(mass > 1e-12, (at_now - at_threshold) / np.where(mass > 1e-12, mass, 1.0), 1.0)
            aged = log_odds - np.log(np.clip(kept, 1e-6, 1.0))
            mean = min(max(float(aged.mean()), -30.0), 30.0)
            running.probability = 1.0 / (1.0 + math.exp(-mean))
    return _plan(self, job, at)


if os.environ.get("AGED"):
    sp._weigh_verdict = weigh_verdict
    sp.Speculate.on_checkpoint = on_checkpoint
    sp.Speculate.plan = plan

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
