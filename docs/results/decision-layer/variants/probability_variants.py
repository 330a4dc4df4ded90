"""The probability variants tried for `SurvivalGate`, as run on commit 9f56989 (before it existed).

Scratch harness, kept so that the table of docs/results.md §11 ("How the probability was chosen")
can be re-run: from a worktree of 9f56989, with this file on PYTHONPATH,

    OMP_NUM_THREADS=1 python probability_variants.py evaluate --format synthetic --jobs 40 \
        --seed 0 --threshold online --checkpoint-seconds 60 --methods sm-s50-l30 \
        --policies speculate --workers 1 --out DIR

Variants (preset names): ``aft-in``/``aft-oof`` the residual curve from the fit's own or out-of-fold
predictions; ``-nw`` no lift; ``-sP`` lift exponent P/100 (else 1); ``-lL`` shrink L/100 toward the
prior (else none); ``-cal`` the calibrated ranking's probability where its calibrator acts; ``sm-``
the mean log-odds of a task's verdicts (kept in the method); ``flag``/``flag-lift`` probability 1
where h (or h / w) reaches the threshold, else the prior. ``POLICY_SMOOTH=1`` averages the verdicts
in the policy instead (what ships). ``sm-s50-l30`` is what ships as `SurvivalGate()`.
"""

import os
import sys

import numpy as np

from straggler.core import nurd
from straggler.core.fast_paths import regressor_predict
from straggler.core.method import Scores
from straggler.core.survival import LatencySurvival


class AftGate(nurd.CalibratedGate):
    mode = "insample"

    def fit(self, model, data, past, observed):
        super().fit(model, data, past, observed)
        model.oof_ = {}
        if (
            self.mode != "oof"
            or model.regressor_ is None
            or data.n_finished < 10
            or data.finished_ids is None
        ):
            return
        from sklearn.model_selection import KFold

        reg = model.regressor_part()
        X = model.scaler_.transform(data.X_finished)
        y = reg.target(data.latency_finished)
        oof = np.empty(len(y))
        for tr, te in KFold(3, shuffle=True, random_state=model.random_state).split(X):
            oof[te] = regressor_predict(reg.fit(X[tr], y[tr], model.random_state), X[te])
        model.oof_ = dict(zip(data.finished_ids, reg.log_latency(oof), strict=True))
        model.oof_r2_ = float(np.clip(1.0 - np.mean((y - oof) ** 2) / max(float(np.var(y)), 1e-12), 0.0, 1.0))

    def scores(self, model, data, view, latency, weight):
        base = super().scores(model, data, view, latency, weight)
        if model.regressor_ is None or data.n_finished < 5 or len(view.guess) == 0:
            return base
        reg = model.regressor_part()
        Xf = model.scaler_.transform(data.X_finished)
        fin = reg.log_latency(regressor_predict(model.regressor_, Xf).astype(np.float64))
        oof = getattr(model, "oof_", {})
        if oof and data.finished_ids is not None:
            fin = np.array([oof.get(t, f) for t, f in zip(data.finished_ids, fin, strict=True)])
        log_h_run = reg.log_latency(view.guess)
        if self.lift:
            log_h_run = log_h_run - self.lift_power * np.log(model.weighting_part().ranking_weight(view.z))
        fin_ratio = np.exp(np.log(np.maximum(data.latency_finished, 1e-3)) - fin)
        run_ratio = np.exp(np.log(np.maximum(data.elapsed_running, 1e-3)) - log_h_run)
        surv = LatencySurvival(fin_ratio, run_ratio)
        thr_ratio = np.exp(np.log(data.threshold) - log_h_run)
        p = surv.sf(thr_ratio) / np.maximum(surv.sf(run_ratio), 1e-12)
        p = np.clip(p, 1e-4, 1 - 1e-4)
        shrink = self.shrink if self.shrink >= 0 else getattr(model, "oof_r2_", 0.0)
        if shrink < 1:
            from scipy.special import expit, logit

            prior = nurd.Nurd.prior(data)
            p = expit(logit(prior) + shrink * (logit(p) - logit(prior)))
        if self.smooth and data.running_ids is not None:
            from scipy.special import expit, logit

            memo = model.__dict__.setdefault("memo_", {})
            lp = logit(p)
            out = np.empty(len(lp))
            for i, t in enumerate(data.running_ids):
                s_, n_ = memo.get(t, (0.0, 0))
                s_, n_ = s_ + lp[i], n_ + 1
                memo[t] = (s_, n_)
                out[i] = s_ / n_
            p = expit(out)
        if getattr(model, "calibrator_", None) is not None and self.keep_calibrated:
            p = base.probability
        return Scores(base.is_straggler, base.latency, base.adjusted, base.propensity, base.weight, p)

    keep_calibrated = False
    lift = True
    shrink = 1.0
    lift_power = 1.0
    smooth = False


def preset(mode, keep, lift=True, shrink=1.0, power=1.0, smooth=False):
    def make(rs):
        g = AftGate()
        g.smooth = smooth
        g.lift_power = power
        g.shrink = shrink
        g.lift = lift
        g.mode = mode
        g.keep_calibrated = keep
        return nurd.Nurd(gate=g, random_state=rs)

    return make


nurd.PRESETS["aft-in"] = preset("insample", False)
nurd.PRESETS["aft-oof"] = preset("oof", False)
nurd.PRESETS["aft-in-cal"] = preset("insample", True)
nurd.PRESETS["aft-in-nw"] = preset("insample", False, False)
nurd.PRESETS["aft-oof-nw"] = preset("oof", False, False)
nurd.PRESETS["aft-oof-s50"] = preset("oof", False, True, 1.0, 0.5)
nurd.PRESETS["aft-oof-s50-l50"] = preset("oof", False, True, 0.5, 0.5)
nurd.PRESETS["aft-oof-s50-l35"] = preset("oof", False, True, 0.35, 0.5)
nurd.PRESETS["aft-oof-s50-l25"] = preset("oof", False, True, 0.25, 0.5)
nurd.PRESETS["aft-oof-s50-l35-cal"] = preset("oof", True, True, 0.35, 0.5)
nurd.PRESETS["aft-oof-s50-l30-cal"] = preset("oof", True, True, 0.30, 0.5)
nurd.PRESETS["aft-in-s50-l30-cal"] = preset("insample", True, True, 0.30, 0.5)
nurd.PRESETS["sm-s50"] = preset("oof", False, True, 1.0, 0.5, True)
nurd.PRESETS["sm-s50-l50"] = preset("oof", False, True, 0.5, 0.5, True)
nurd.PRESETS["sm-s50-l40"] = preset("oof", False, True, 0.4, 0.5, True)
nurd.PRESETS["sm-s50-l30"] = preset("oof", False, True, 0.3, 0.5, True)
nurd.PRESETS["aft-oof-s50-l30"] = preset("oof", False, True, 0.3, 0.5, False)
nurd.PRESETS["sm-s50-skill"] = preset("oof", False, True, -1.0, 0.5, True)
nurd.PRESETS["sm-s70-l30"] = preset("oof", False, True, 0.3, 0.7, True)
nurd.PRESETS["sm-s35-l50"] = preset("oof", False, True, 0.5, 0.35, True)
nurd.PRESETS["aft-oof-s50-l25-cal"] = preset("oof", True, True, 0.25, 0.5)
nurd.PRESETS["aft-oof-s35-l50"] = preset("oof", False, True, 0.5, 0.35)
nurd.PRESETS["aft-oof-s75-l35"] = preset("oof", False, True, 0.35, 0.75)
for pct in (25, 50, 75):
    nurd.PRESETS[f"aft-in-l{pct}"] = preset("insample", False, True, pct / 100)
    nurd.PRESETS[f"aft-oof-l{pct}"] = preset("oof", False, True, pct / 100)


class FlagGate(nurd.CalibratedGate):
    lift = False

    def scores(self, model, data, view, latency, weight):
        base = super().scores(model, data, view, latency, weight)
        if getattr(model, "calibrator_", None) is not None or data.n_finished == 0:
            return base
        flag = base.is_straggler
        if self.lift:
            adj = latency / model.weighting_part().ranking_weight(view.z)
            flag = adj >= data.threshold
        p = np.where(flag, 1.0, base.probability)
        return Scores(base.is_straggler | flag, base.latency, base.adjusted, base.propensity, base.weight, p)


def flag_preset(lift):
    def make(rs):
        g = FlagGate()
        g.lift = lift
        return nurd.Nurd(gate=g, random_state=rs)

    return make


nurd.PRESETS["flag"] = flag_preset(False)
nurd.PRESETS["flag-lift"] = flag_preset(True)


if os.environ.get("POLICY_SMOOTH"):
    import dataclasses
    import math

    from scipy.special import expit, logit

    from straggler.core import speculation

    _orig = speculation.Speculate.on_checkpoint

    def on_checkpoint(self, job_id, at, decisions):
        memo = self.__dict__.setdefault("memo_", {})
        out = []
        for d in decisions:
            p = d.straggle_probability
            if not math.isnan(p):
                key = (job_id, d.task_id, d.attempt)
                s_, n_ = memo.get(key, (0.0, 0))
                s_, n_ = s_ + float(logit(min(max(p, 1e-4), 1 - 1e-4))), n_ + 1
                memo[key] = (s_, n_)
                d = dataclasses.replace(d, straggle_probability=float(expit(s_ / n_)))
            out.append(d)
        return _orig(self, job_id, at, out)

    speculation.Speculate.on_checkpoint = on_checkpoint

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
