"""The variants tried on the way to the calibrated survival prior that ships (docs/results.md §11,
"The survival prior, calibrated across jobs"). Scratch harness; from the repository root:

    DOCS=docs/results/decision-layer/variants
    OMP_NUM_THREADS=1 PYTHONPATH=$DOCS .venv/bin/python $DOCS/prior_variants.py evaluate \
        --format synthetic --jobs 40 --seed 0 --threshold online --checkpoint-seconds 60 \
        --methods prior-s15 --policies speculate --workers 1 --out DIR

Presets (each a `SurvivalPredictor`; the shipped one is ``SurvivalPredictor(shrink=0.2)`` with the shipped
`PriorCalibration(-1.737, 0.713, 2.013)`):

- ``prior-sS``: the shipped calibration, shrink S/100;
- ``prior-raw``: the `nurd` before the calibration (shrink 0.25, the raw prior);
- ``prior-interaction``: shrink 0.25 and a first fit that also had a prior x share term,
  logit p' = -1.7319 + 0.7198 logit p + 2.0039 share - 0.0109 share logit p;
- ``prior-capped``: shrink 0.25, the prior's P(latency >= threshold) capped at 1 - 0.9 (the
  threshold is the p90), calibrated by -0.7073 + 0.8469 logit p + 0.9371 share;
- ``prior-crossjob``: the shipped gate with its calibration fitted on the *other* jobs of the
  evaluated trace (cross-fitted by job, as the evaluator does for START): what a calibration learned
  from a cluster's own completed jobs would give (not shipped: the worker has no cross-job state);
- ``prior-joint``: one logistic map of the prior, the residual curve's own probability and the
  share, -1.3812 + 0.401 logit prior + 0.2553 logit model + 1.2057 share, in place of the shrink;
- ``bold-B``: the shipped `nurd` with B added to the log-odds of every probability it hands the
  policy once a task of the job has finished (miscalibrated on purpose: does spending more buy the
  bar, and where?).

Every coefficient above was fitted on the synthetic generator's seeds 10 and 11 (60 s and 300 s
checkpoints pooled), as `scripts/fit_prior_calibration.py` does for the shipped one.
"""

import sys

import numpy as np
from scipy.special import expit, logit

from straggler.core import nurd
from straggler.core.method import Scores
from straggler.core.prior_calibration import PriorCalibration, fit_prior_calibration
from straggler.core.survival import LatencySurvival


class InteractionGate(nurd.SurvivalPredictor):
    """The calibration with a prior x share term."""

    def prior(self, data):
        share = data.n_finished / max(data.expected_tasks, 1)
        z = logit(nurd.Nurd.prior(data))
        return np.clip(expit(-1.7319 + 0.7198 * z + 2.0039 * share - 0.0109 * share * z), 1e-4, 1 - 1e-4)


class CappedGate(nurd.SurvivalPredictor):
    """The prior with P(latency >= threshold) at most 0.1, then calibrated."""

    def prior(self, data):
        survival = LatencySurvival(data.latency_finished, data.elapsed_running)
        reach = min(float(survival.sf(np.array([data.threshold]))[0]), 0.1)
        capped = np.clip(reach / np.maximum(survival.sf(data.elapsed_running), 1e-12), 1e-4, 1 - 1e-4)
        share = data.n_finished / max(data.expected_tasks, 1)
        return PriorCalibration(-0.7073, 0.8469, 0.9371).transform(capped, share)


class JointGate(nurd.SurvivalPredictor):
    """One map of the raw prior, the model's probability (the gate at shrink 1) and the share."""

    def scores(self, model, data, view, latency, weight):
        full = super().scores(model, data, view, latency, weight)
        if data.n_finished == 0:
            return full
        share = data.n_finished / max(data.expected_tasks, 1)
        lm = logit(np.clip(full.probability, 1e-4, 1 - 1e-4))
        z = -1.3812 + 0.401 * logit(nurd.Nurd.prior(data)) + 0.2553 * lm + 1.2057 * share
        return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight, expit(z))


class BoldGate(nurd.SurvivalPredictor):
    """The shipped gate with ``shift`` added to every probability's log-odds: a bolder `nurd`."""

    def __init__(self, shift: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shift = shift

    def scores(self, model, data, view, latency, weight):
        full = super().scores(model, data, view, latency, weight)
        if data.n_finished == 0:
            return full
        bold = expit(logit(np.clip(full.probability, 1e-4, 1 - 1e-4)) + self.shift)
        return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight, bold)


class CrossJobNurd(nurd.Nurd):
    """The shipped `nurd` whose prior calibration is fitted on complete jobs of the same trace."""

    learns_across_jobs = True

    def fit_population(self, jobs):
        self.gate = nurd.SurvivalPredictor(calibration=fit_prior_calibration(jobs))
        print(f"prior-crossjob: {self.gate.calibration}", file=sys.stderr)
        return self


RAW = PriorCalibration(0.0, 1.0, 0.0)
for s in (15, 20, 25):
    nurd.PRESETS[f"prior-s{s}"] = lambda rs, s=s: nurd.Nurd(
        gate=nurd.SurvivalPredictor(shrink=s / 100), random_state=rs
    )
nurd.PRESETS["prior-raw"] = lambda rs: nurd.Nurd(
    gate=nurd.SurvivalPredictor(shrink=0.25, calibration=RAW), random_state=rs
)
for b in (1, 2, 3, 4):
    nurd.PRESETS[f"bold-{b}"] = lambda rs, b=b: nurd.Nurd(gate=BoldGate(shift=float(b)), random_state=rs)
nurd.PRESETS["prior-crossjob"] = lambda rs: CrossJobNurd(random_state=rs)
nurd.PRESETS["prior-interaction"] = lambda rs: nurd.Nurd(gate=InteractionGate(shrink=0.25), random_state=rs)
nurd.PRESETS["prior-capped"] = lambda rs: nurd.Nurd(gate=CappedGate(shrink=0.25), random_state=rs)
nurd.PRESETS["prior-joint"] = lambda rs: nurd.Nurd(
    gate=JointGate(shrink=1.0, calibration=RAW), random_state=rs
)

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
