"""The policy's survival curve with a censored log-normal tail (tried, not shipped).

Scratch harness for docs/results.md §11 ("What the blind traces' misses are made of"). Past the last
event of a job's Kaplan-Meier curve, the shipped `LatencySurvival` continues with an exponential
tail whose scale is the curve's restricted mean. With ``TAIL=lognormal`` the policy's curve (only
the policy's: the predictors keep theirs) continues instead as S(x_last) * S_LN(x) / S_LN(x_last),
S_LN a log-normal fitted by maximum likelihood to the finished latencies and the running tasks'
elapsed times (right-censored) by `straggler.core.threshold.censored_lognormal`, the fit the online
threshold extrapolates with. From the repository root:

    DOCS=docs/results/decision-layer/variants
    TAIL=lognormal OMP_NUM_THREADS=1 .venv/bin/python $DOCS/tail_variants.py evaluate \
        --format synthetic --jobs 40 --seed 0 --threshold online --checkpoint-seconds 60 \
        --methods nurd,reactive --policies speculate --workers 1 --out DIR
"""

import os
import sys

import numpy as np
from scipy import special

from straggler.core import speculation
from straggler.core.survival import LatencySurvival
from straggler.core.threshold import censored_lognormal


class LogNormalTail(LatencySurvival):
    """`LatencySurvival` whose tail past the last event is a fitted log-normal's (two finished tasks on)."""

    def __init__(self, finished, running_elapsed, stuck_prior: float = 0.0) -> None:
        super().__init__(finished, running_elapsed, stuck_prior)
        finished = np.asarray(finished, dtype=np.float64)
        self.fit = (
            censored_lognormal(finished, np.asarray(running_elapsed, dtype=np.float64))
            if len(finished) >= 2
            else None
        )

    def sf(self, x):
        if self.fit is None:
            return super().sf(x)
        x = np.asarray(x, dtype=np.float64)
        mu, sigma = self.fit
        inside = super().sf(x)  # the Kaplan-Meier steps up to the last event; its tail is replaced below

        def log_sf(t):
            return special.log_ndtr(-(np.log(np.maximum(t, 1e-9)) - mu) / sigma)

        ratio = np.exp(np.minimum(log_sf(np.maximum(x, self.last_time)) - log_sf(self.last_time), 0.0))
        return np.where(x > self.last_time, self.last_value * ratio, inside)


if os.environ.get("TAIL") == "lognormal":
    speculation.LatencySurvival = LogNormalTail  # the name `_estimate` builds the policy's curve with

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
