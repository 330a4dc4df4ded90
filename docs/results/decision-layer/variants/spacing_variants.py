"""The variants tried to make one `nurd` win at both checkpoint spacings, as run on commit b16ba07.

Scratch harness, kept so that the table of docs/results.md §11 ("One probability for both
spacings") can be re-run: from the repository root,

    DOCS=docs/results/decision-layer/variants
    OMP_NUM_THREADS=1 PYTHONPATH=$DOCS .venv/bin/python $DOCS/spacing_variants.py evaluate \
        --format synthetic --jobs 40 --seed 0 --threshold online --checkpoint-seconds 60 \
        --methods preq-s35 --policies speculate --workers 1 --out DIR

(`.venv/bin/python $DOCS/table.py $DOCS/spacing` renders the table.) Presets: ``preq-sS`` is
`SurvivalGate(shrink=S/100)` (``preq-s25`` ships); ``preq-lL-sS`` also lift L/100;
``preq-s50-count`` shrink 0.5 n/(n + 20) with n finished tasks; ``preq-s50-elapsed`` shrink 0.5
min(1, elapsed / median finished latency). Environment variables change how the policy weighs a
task's verdicts (`speculation._weigh_verdict`, the mean of their log-odds, ships):

- ``FORGET=λ``: an exponentially weighted mean, each earlier verdict's weight times λ per
  checkpoint (``-forget``: λ = exp(-Δ/300 s), 0.82 at 60 s and 0.37 at 300 s);
- ``EVIDENCE=1``: today's survival prior plus the mean of the verdicts' evidence (a verdict's
  log-odds less the prior's at its checkpoint), so an old verdict's low prior does not stay;
- ``PRIOR_SECONDS=W``: a mean weighted by the seconds each verdict covers, the prior at the first
  verdict weighing W seconds (``-prior120``);
- ``BUDGET=B``: the policy's per-job budget (0.1 ships; ``-budget20`` is 0.2, a diagnostic).
"""

import dataclasses
import math
import os
import sys

import numpy as np
from scipy.special import expit, logit

from straggler.core import nurd, speculation
from straggler.core.survival import LatencySurvival


class CountShrinkGate(nurd.SurvivalGate):
    """The shrink grows with the finished tasks: ``top`` n / (n + ``half``)."""

    top, half = 0.5, 20.0

    def scores(self, model, data, view, latency, weight):
        self.shrink = self.top * data.n_finished / (data.n_finished + self.half)
        return super().scores(model, data, view, latency, weight)


class ElapsedShrinkGate(nurd.SurvivalGate):
    """The shrink grows with a task's elapsed time: ``top`` min(1, elapsed / median finished)."""

    top = 0.5

    def scores(self, model, data, view, latency, weight):
        self.shrink = 1.0
        base = super().scores(model, data, view, latency, weight)
        if data.n_finished < 5 or model.regressor_ is None or len(view.guess) == 0:
            return base
        prior = nurd.Nurd.prior(data)
        median = float(np.median(data.latency_finished))
        shrink = self.top * np.minimum(1.0, data.elapsed_running / median)
        p = np.clip(base.probability, 1e-4, 1 - 1e-4)
        q = expit(logit(prior) + shrink * (logit(p) - logit(prior)))
        return nurd.Scores(base.is_straggler, base.latency, base.adjusted, base.propensity, base.weight, q)


def preset(gate):
    return lambda random_state: nurd.Nurd(gate=gate(), random_state=random_state)


for s in (20, 25, 30, 35, 40, 50):
    nurd.PRESETS[f"preq-s{s}"] = preset(lambda s=s: nurd.SurvivalGate(shrink=s / 100))
nurd.PRESETS["preq-l35-s50"] = preset(lambda: nurd.SurvivalGate(shrink=0.5, lift=0.35))
nurd.PRESETS["preq-s50-count"] = preset(CountShrinkGate)
nurd.PRESETS["preq-s50-elapsed"] = preset(ElapsedShrinkGate)


def _prior(job, decisions, d):
    """The policy's survival prior P(L >= threshold | L >= elapsed) of decision ``d``."""
    live = [x.elapsed for x in decisions if x.task_id not in job.finished]
    curve = LatencySurvival(np.fromiter(job.finished.values(), dtype=np.float64), np.array(live))
    reach = curve.sf(np.array([d.threshold]))[0] / max(float(curve.sf(np.array([d.elapsed]))[0]), 1e-12)
    return float(logit(min(max(reach, 1e-4), 1 - 1e-4)))


def reweigh(combine):
    """Replace the policy's mean of log-odds by ``combine(memo, key, job, decisions, d) -> p``."""
    original = speculation.Speculate.on_checkpoint

    def keep_latest(running, previous, probability):
        running.probability = probability

    def on_checkpoint(self, job_id, at, decisions):
        job = self._job(job_id)
        if not job.finished:
            return original(self, job_id, at, decisions)
        memo = self.__dict__.setdefault("memo_", {})
        out = []
        for d in decisions:
            if d.task_id in job.finished or math.isnan(d.straggle_probability):
                out.append(d)
                continue
            p = combine(memo, (job_id, d.task_id, d.attempt), job, decisions, d)
            out.append(dataclasses.replace(d, straggle_probability=p))
        return original(self, job_id, at, out)

    speculation._weigh_verdict = keep_latest
    speculation.Speculate.on_checkpoint = on_checkpoint


def log_odds(d):
    p = min(max(d.straggle_probability, 1e-4), 1 - 1e-4)
    return float(logit(p))


if os.environ.get("FORGET"):
    forget = float(os.environ["FORGET"])

    def forgetting(memo, key, job, decisions, d):
        total, weight = memo.get(key, (0.0, 0.0))
        memo[key] = total, weight = forget * total + log_odds(d), forget * weight + 1.0
        return float(expit(total / weight))

    reweigh(forgetting)

if os.environ.get("EVIDENCE"):

    def evidence(memo, key, job, decisions, d):
        prior = _prior(job, decisions, d)
        total, n = memo.get(key, (0.0, 0))
        memo[key] = total, n = total + log_odds(d) - prior, n + 1
        return float(expit(prior + total / n))

    reweigh(evidence)

if os.environ.get("PRIOR_SECONDS"):
    prior_seconds = float(os.environ["PRIOR_SECONDS"])

    def time_weighted(memo, key, job, decisions, d):
        if key not in memo:
            memo[key] = (prior_seconds * _prior(job, decisions, d), prior_seconds, 0.0)
        total, weight, seen = memo[key]
        covered = max(d.elapsed - seen, 1.0)
        memo[key] = total, weight, _ = total + covered * log_odds(d), weight + covered, d.elapsed
        return float(expit(total / weight))

    reweigh(time_weighted)

if os.environ.get("BUDGET"):
    _init = speculation.Speculate.__init__

    def __init__(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if type(self) is speculation.Speculate:
            self.budget = float(os.environ["BUDGET"])

    speculation.Speculate.__init__ = __init__


if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
