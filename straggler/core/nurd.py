"""NURD: negative-unlabeled straggler prediction (Ding et al., MLSys 2022), built from parts.

Per checkpoint, as in the paper: a latency regressor h on the finished tasks
(`GradientBoostedLatency`), a propensity model z = P(finished | x) (`LogisticPropensity`) turned into a
weight w per running task (a `Weighting`), adjusted latency = h(x) / w, straggler if >= threshold.
The third part (a `Gate`) turns h and w into scores: a gate decides how far they are trusted, fully
(`NoGate`), by h's skill (`SkillGate`), by a backtest of w's strength (`BacktestGate`) or through a
ranking calibrated on the job's own past (`CalibratedGate`); the `SurvivalPredictor` instead reads
them as an accelerated-failure-time model whose residual curve is the job's own, and gives the policy
a straggle probability from a task's first checkpoint. Each part holds and checks its own parameters
and, fitted, its own learned attributes (`Nurd.gate_`). `Nurd()` is the shipped ``nurd``:
`GradientBoostedLatency()`, `DensityWeighting(strength=0.0)` and `SurvivalPredictor()`; `PRESETS`
builds the variants compared with it.

What each preset does and why: docs/architecture.md, "NURD"; results: docs/results.md; how each was
chosen: the record, `git show 96386f7:docs/results.md`, §8, §10, §11.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar, Self

import numpy as np
import xgboost as xgb
from scipy.special import betaincc, chdtrc, expit, logit
from scipy.stats import rankdata
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.fast_paths import fit_booster, fit_logistic, positive_probability, regressor_predict
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.parameters import BOOLEAN, Constraint, Interval, check_own_parameters, check_parameters
from straggler.core.preprocessing import Standardiser, impute_like, nan_column_means
from straggler.core.prior_calibration import PriorCalibration, survival_prior
from straggler.core.state import (
    BOOSTER,
    STANDARDISER,
    State,
    StateCodec,
    dump_attributes,
    linear_model,
    listed,
    load_attributes,
    optional,
)
from straggler.core.survival import LatencySurvival

STRENGTHS = (0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
"""Candidate strengths of the density weight; the backtest picks one per job and refit."""

_AT_LEAST_ONE = Interval(Integral, 1, None, "left")
_PROBABILITY = Interval(Real, 0, 1, "neither")


def centroid_calibration(X_finished: FloatArray, X_running: FloatArray, alpha: float) -> float:
    """The paper's delta = 1 / (1 + rho) - alpha, rho = ||c_fin||^2 / ||c_run - c_fin||^2 (raw features)."""
    c_fin = nan_column_means(X_finished)
    c_run = nan_column_means(X_running) if len(X_running) else c_fin
    gap = float(np.sum((c_run - c_fin) ** 2))
    rho = float(np.sum(c_fin**2)) / gap if gap > 0 else np.inf
    return 1.0 / (1.0 + rho) - alpha


def mostly_right(right: int, wrong: int, confidence: float) -> bool:
    """Is P(precision > 1/2 | right, wrong) >= ``confidence``, under a uniform prior on precision?

    The rule before it, "at least two right and no more wrong than right", admitted 2 model flags
    over the 484 jobs of the real trace at 60 s, both wrong (backtests of 2 right / 2 wrong, 3 / 1
    and 6 / 4): with so few flags a precision of 1/2 to 3/4 is noise. At the default 0.85 it takes
    2 right and none wrong, 4 / 1 or 7 / 3; 0.85 rather than 0.9 keeps 2 / 0, the evidence on which
    NURD's early flags in `tests/test_nurd.py`'s slow-machine jobs rest. Both numbers were chosen
    after seeing those results (the record says so: `git show 96386f7:docs/results.md`, Discussion).
    """
    if right == 0:
        return False
    return float(betaincc(right + 1, wrong + 1, 0.5)) >= confidence  # the Beta posterior's sf at 1/2


# -- the regressor and the propensity model ----------------------------------------------------------


class GradientBoostedLatency(BaseEstimator):
    """The latency regressor h: XGBoost trees on the finished tasks. ``log_target``: learn log
    latency (skewed latencies), else latency itself (the paper's GBTR)."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "n_estimators": [_AT_LEAST_ONE],
        "max_depth": [_AT_LEAST_ONE],
        "learning_rate": [Interval(Real, 0, 1, "right")],
        "log_target": [BOOLEAN],
        "n_threads": [_AT_LEAST_ONE],
    }

    def __init__(
        self,
        n_estimators: int = 60,
        max_depth: int = 4,
        learning_rate: float = 0.1,
        log_target: bool = True,
        n_threads: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.log_target = log_target
        self.n_threads = n_threads

    def check(self) -> None:
        """Raise ValueError naming a parameter out of range."""
        check_own_parameters(self)

    def booster_params(self, random_state: int) -> dict[str, Any]:
        """XGBoost's booster parameters for these: what ``XGBRegressor(n_estimators, max_depth,
        learning_rate, tree_method="hist", n_jobs=n_threads, random_state, verbosity=0)`` trains with."""
        return {
            "objective": "reg:squarederror",
            "learning_rate": self.learning_rate,
            "max_depth": self.max_depth,
            "n_jobs": self.n_threads,
            "random_state": random_state,
            "tree_method": "hist",
            "verbosity": 0,
        }

    def fit(self, X: FloatArray, target: FloatArray, random_state: int) -> xgb.Booster:
        """A booster fitted to ``target`` (`target`'s scale), ``n_estimators`` rounds."""
        return fit_booster(self.booster_params(random_state), X, target, self.n_estimators)

    def target(self, latency: FloatArray) -> FloatArray:
        """What the regressor learns: log latency if ``log_target``, else latency."""
        return np.log(np.maximum(latency, 1e-3)) if self.log_target else latency

    def latency(self, target: FloatArray) -> FloatArray:
        """A prediction on `target`'s scale back in seconds."""
        return np.exp(target) if self.log_target else np.maximum(target, 0.0)

    def log_latency(self, target: FloatArray) -> FloatArray:
        """A prediction on `target`'s scale as log seconds."""
        return target if self.log_target else np.log(np.maximum(target, 1e-3))


class LogisticPropensity(BaseEstimator):
    """The propensity model z = P(finished | x): logistic regression, finished against running.
    ``balanced``: both classes weigh the same, so z / (1 - z) reads as the density ratio
    p(x | finished) / p(x | running) (the paper fits it unbalanced)."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {"balanced": [BOOLEAN]}

    def __init__(self, balanced: bool = True) -> None:
        self.balanced = balanced

    def check(self) -> None:
        """Raise ValueError naming a parameter out of range."""
        check_own_parameters(self)

    def fit(self, X_finished: FloatArray, X_running: FloatArray) -> LogisticRegression:
        X = np.vstack([X_finished, X_running])
        labels = np.concatenate([np.ones(len(X_finished)), np.zeros(len(X_running))])
        return fit_logistic(X, labels, C=1.0, max_iter=300, balanced=self.balanced)


# -- the weighting ------------------------------------------------------------------------------------


class Weighting(ABC, BaseEstimator):
    """How a running task's propensity z becomes its weight w in [eps, 1]; adjusted latency = h / w.
    ``propensity``: the propensity model (None: `LogisticPropensity()`); ``eps``: the smallest weight."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "propensity": [LogisticPropensity, None],
        "eps": [Interval(Real, 0, 1, "right")],
    }
    reads_propensity: ClassVar[bool] = True

    def __init__(self, propensity: LogisticPropensity | None = None, eps: float = 0.05) -> None:
        self.propensity = propensity
        self.eps = eps

    def check(self) -> None:
        """Raise ValueError naming a parameter out of range (its propensity model's too)."""
        check_own_parameters(self)
        if self.reads_propensity:
            self.propensity_model().check()

    def propensity_model(self) -> LogisticPropensity:
        return LogisticPropensity() if self.propensity is None else self.propensity

    def offset(self, data: CheckpointData) -> float:
        """A per-job constant the weight reads (the paper's delta, `PaperWeighting`), learned once."""
        return 0.0

    @abstractmethod
    def weight(self, z: FloatArray, offset: float, strength: float | None) -> FloatArray:
        """w per running task from its propensity ``z`` (ones where no propensity model was fitted),
        the job's `offset` and the strength the gate chose (None: none; read by `DensityWeighting`
        only, and only when it fixes none itself)."""

    def ranking_weight(self, z: FloatArray) -> FloatArray:
        """The weight `CalibratedGate` and `BacktestGate` rank by: the density ratio z / (1 - z),
        clipped to [eps, 1], at full strength."""
        return np.clip(_odds(z), self.eps, 1.0)


class NoWeighting(Weighting):
    """w = 1: the regressor alone (``gbtr``); no propensity model, no parameters."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {}
    reads_propensity = False

    def __init__(self) -> None:
        """No parameters (declared so that ``get_params`` finds none)."""

    def weight(self, z: FloatArray, offset: float, strength: float | None) -> FloatArray:
        return np.ones_like(z)

    def ranking_weight(self, z: FloatArray) -> FloatArray:
        return np.ones(len(z))


class PropensityWeighting(Weighting):
    """w = clip(z, eps, 1): the paper's weight without its calibration (``nurd-nc``)."""

    def weight(self, z: FloatArray, offset: float, strength: float | None) -> FloatArray:
        return np.clip(z, self.eps, 1.0)


class PaperWeighting(Weighting):
    """w = clip(z + delta, eps, 1), delta = 1 / (1 + rho) - ``alpha`` from the raw feature centroids,
    once per job (`centroid_calibration`): the paper taken literally (``nurd-paper``)."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        **Weighting._parameter_constraints,
        "alpha": [Interval(Real, 0, 1, "both")],
    }

    def __init__(
        self, propensity: LogisticPropensity | None = None, eps: float = 0.05, alpha: float = 0.5
    ) -> None:
        super().__init__(propensity, eps)
        self.alpha = alpha

    def offset(self, data: CheckpointData) -> float:
        X_fin = impute_like(data.X_finished, data.X_finished)
        X_run = impute_like(data.X_finished, data.X_running)
        return centroid_calibration(X_fin, X_run, self.alpha)

    def weight(self, z: FloatArray, offset: float, strength: float | None) -> FloatArray:
        return np.clip(z + offset, self.eps, 1.0)


class DensityWeighting(Weighting):
    """w = clip(z / (1 - z), eps, 1) ** strength: a class-balanced propensity read as a density ratio
    (the literal z + delta sits at eps early in a job and inflates every prediction).

    ``strength``: the exponent, fixed; None leaves it to a gate that chooses one (`SkillGate`,
    `BacktestGate`, `NoGate`). The shipped nurd fixes 0: its flags read h alone (w = 1), and its
    `SurvivalPredictor` reads the density ratio (`ranking_weight`) for its lift only."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        **Weighting._parameter_constraints,
        "strength": [Interval(Real, 0, 1, "both"), None],
    }

    def __init__(
        self, propensity: LogisticPropensity | None = None, eps: float = 0.05, strength: float | None = 0.0
    ) -> None:
        super().__init__(propensity, eps)
        self.strength = strength

    def weight(self, z: FloatArray, offset: float, strength: float | None) -> FloatArray:
        exponent = self.strength if self.strength is not None else strength
        if exponent is None:
            raise ValueError("DensityWeighting(strength=None) needs a gate that chooses the strength")
        return self.ranking_weight(z) ** exponent


# -- the gate -----------------------------------------------------------------------------------------


class Gate(ABC, BaseEstimator):
    """NURD's third part: how a fit turns h and w into `Scores`. A gate on trust (`NoGate`,
    `SkillGate`, `BacktestGate`, `CalibratedGate`) or the probabilistic `SurvivalPredictor`.

    ``Nurd.fit`` fits an unfitted copy of the part (the parameter itself stays unfitted) and keeps it
    as its ``gate_``; ``fit`` learns the part's own attributes only: ``skill_``, how far h is shrunk
    toward the finished mean (read only where `shrinks_latency`), and ``strength_``, the density
    weight's strength the part chooses (None if it chooses none, `chooses_strength`). A strength comes
    from one place: `DensityWeighting`'s ``strength`` if it fixes one, else a gate that chooses it;
    `check` refuses a composition where both or neither would.
    """

    shrinks_latency: ClassVar[bool] = False
    chooses_strength: ClassVar[bool] = False
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {}
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {}
    """Learned attributes that are not plain state values, and how each becomes one."""
    skill_: float
    strength_: float | None

    def check(self, weighting: Weighting) -> None:
        """Raise ValueError naming a parameter out of range, or a weighting this gate cannot use."""
        check_own_parameters(self)
        if not isinstance(weighting, DensityWeighting):
            return
        name = type(self).__name__
        if self.chooses_strength and weighting.strength is not None:
            raise ValueError(
                f"{name} chooses DensityWeighting's strength, which the weighting fixes at "
                f"{weighting.strength!r}: give DensityWeighting(strength=None)"
            )
        if not self.chooses_strength and weighting.strength is None:
            raise ValueError(
                f"{name} chooses no strength for DensityWeighting: fix one in the weighting "
                "(the shipped nurd's is DensityWeighting(strength=0.0))"
            )

    def past_fits_kept(self) -> int:
        """How many of the job's previous fits a fit keeps to reuse (``history_``)."""
        return 0

    @abstractmethod
    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        """Learn this part's attributes from ``data`` and ``model`` (fitted but for this part, which it
        reads and never writes); ``past``: the job's previous fits kept, ``observed``: the finished
        then the running tasks' features."""

    def scores(
        self, model: Nurd, data: CheckpointData, view: _RunningView, latency: FloatArray, weight: FloatArray
    ) -> Scores:
        """The running tasks' scores from the predicted ``latency`` and ``weight``."""
        return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight)

    def get_state(self) -> State:
        """The learned attributes as plain data (`straggler.core.state`)."""
        return dump_attributes(self, self.state_codecs)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Take back what `get_state` returned, on an unfitted copy of the same part."""
        load_attributes(self, state, self.state_codecs)


class NoGate(Gate):
    """Trust h and w fully: no shrinkage, strength 1 (``nurd-paper``, ``nurd-nc``, ``gbtr``)."""

    chooses_strength = True

    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        self.skill_ = 1.0
        self.strength_ = 1.0
        return self


class SkillGate(Gate):
    """Shrink h toward the finished mean by its skill, R^2 in [0, 1], and take it as the weight's
    strength. The skill is out-of-fold over ``folds`` folds, or with ``reuse_past_fits`` > 0 how well
    that many of the job's previous fits predicted the tasks that finished after them (prequential).
    Not scikit-learn's ``warm_start``: every fit still trains its models from scratch."""

    shrinks_latency = True
    chooses_strength = True
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "folds": [Interval(Integral, 2, None, "left")],
        "reuse_past_fits": [Interval(Integral, 0, None, "left")],
    }

    def __init__(self, folds: int = 3, reuse_past_fits: int = 0) -> None:
        self.folds = folds
        self.reuse_past_fits = reuse_past_fits

    def past_fits_kept(self) -> int:
        return int(self.reuse_past_fits)

    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        self.skill_ = self.skill(model, data, past)
        self.strength_ = self.skill_
        return self

    def skill(self, model: Nurd, data: CheckpointData, past: list[Nurd]) -> float:
        skill = self._prequential_skill(model, data, past) if past else None
        return self._out_of_fold_skill(model, data) if skill is None else skill

    def _out_of_fold_skill(self, model: Nurd, data: CheckpointData) -> float:
        """Out-of-fold R^2 of the regressor on the finished tasks, clipped to [0, 1]."""
        regressor = model.regressor_part()
        X, y = model.scaler_.transform(data.X_finished), regressor.target(data.latency_finished)
        n = len(y)
        if n < 3 * self.folds or float(np.var(y)) <= 1e-12:
            return 0.0
        oof = _out_of_fold_guess(model, X, y, self.folds)
        r2 = 1.0 - float(np.mean((y - oof) ** 2)) / float(np.var(y))
        return float(np.clip(r2, 0.0, 1.0))

    def _prequential_skill(self, model: Nurd, data: CheckpointData, past: list[Nurd]) -> float | None:
        """R^2 of the previous fits on the tasks that finished after them, each task judged by the
        last fit made before it finished, against that fit's mean; None if fewer than
        ``3 * folds`` such tasks. Out of sample by construction, and it measures the models as
        they were used: on tasks that were still running when they were fitted."""
        assert data.finish_time is not None
        y = model.regressor_part().target(data.latency_finished)
        judged_by = np.full(len(y), -1)
        for j, fit in enumerate(past):
            judged_by[data.finish_time > fit.fitted_at_] = j
        if int(np.sum(judged_by >= 0)) < 3 * self.folds:
            return None
        error = baseline = 0.0
        for j, fit in enumerate(past):
            mine = judged_by == j
            if not mine.any():
                continue
            X = fit.scaler_.transform(data.X_finished[mine])
            guess = regressor_predict(fit.regressor_, X) if fit.regressor_ is not None else fit.mean_target_
            error += float(np.sum((y[mine] - guess) ** 2))
            baseline += float(np.sum((y[mine] - fit.mean_target_) ** 2))
        if baseline <= 1e-12:
            return 0.0
        return float(np.clip(1.0 - error / baseline, 0.0, 1.0))


class BacktestGate(SkillGate):
    """`SkillGate`'s shrinkage, with the density weight's strength picked by backtests over the job's
    own past (`strength`); a strength is admitted only on ``evidence`` that the flags it adds were
    mostly right (`mostly_right`). Needs `DensityWeighting`, whose strength it picks."""

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        **SkillGate._parameter_constraints,
        "evidence": [_PROBABILITY],
    }

    def __init__(self, folds: int = 3, reuse_past_fits: int = 0, evidence: float = 0.85) -> None:
        super().__init__(folds, reuse_past_fits)
        self.evidence = evidence

    def check(self, weighting: Weighting) -> None:
        super().check(weighting)
        if not isinstance(weighting, DensityWeighting):
            raise ValueError(
                "BacktestGate picks DensityWeighting's strength, got weighting "
                f"{weighting!r} (SkillGate is the same without it)"
            )

    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        self.skill_ = self.skill(model, data, past)
        self.strength_ = self.strength(model, data, past, observed)
        return self

    def _rewinds(self, data: CheckpointData, past: list[Nurd]) -> Iterator[tuple[float, Nurd | None]]:
        """The past moments the backtest replays, with the model that predicted then (None: refit it).

        No past fits: when a quarter, a half and three quarters of today's finished tasks had finished.
        Past fits (``reuse_past_fits``): the moments of the job's previous fits, with those very models."""
        if past:
            for fit in past:
                yield fit.fitted_at_, fit
            return
        assert data.finish_time is not None
        ordered = np.sort(data.finish_time)
        for share in (0.25, 0.5, 0.75):
            yield float(ordered[int(share * len(ordered)) - 1]), None

    def strength(self, model: Nurd, data: CheckpointData, past: list[Nurd], X_all: FloatArray) -> float:
        """Pick the weight's strength that would have done best over this job's own past.

        The job is rewound to the moments a quarter, a half and three quarters of today's finished
        tasks had finished; at each, a model is refitted on what had finished then (with a
        `SkillGate`) and every task running then is judged with each candidate strength. As in the
        live protocol, a task flagged at any of those moments stays flagged. A task counts as a
        straggler only once that is known now (it finished at or over the threshold, or has already
        run that long); anything else counts as a non-straggler, so flags not yet confirmed cost
        precision and the choice leans conservative. A strength is admissible only if the flags it
        adds to strength 0 were mostly right with confidence ``evidence`` (`mostly_right`: precision
        above 1/2, the break-even point at which an extra flag helps F1); among admissible strengths
        the best F1 wins, a tie going to the weaker. Everything used is known at this checkpoint.
        With ``reuse_past_fits``, the job's own previous fits are replayed instead (`_rewinds`).
        ``X_all``: the finished then the running tasks' features, as `Nurd.fit` stacked them.
        """
        if data.at is None or data.finish_time is None or data.start_running is None:
            return 0.0
        finish, latency = data.finish_time, data.latency_finished
        if len(finish) < 12:
            return 0.0
        start_finished = finish - latency
        truth = np.r_[latency >= data.threshold, data.at - data.start_running >= data.threshold]
        if not mostly_right(int(truth.sum()), 0, self.evidence):
            return 0.0  # too few confirmed stragglers for any evidence: spare the refits below
        flagged = np.zeros((len(STRENGTHS), len(truth)), dtype=bool)
        judged = np.zeros(len(truth), dtype=bool)
        for rewind, then_model in self._rewinds(data, past):
            done_then = finish <= rewind
            running_then = np.r_[~done_then & (start_finished <= rewind), data.start_running <= rewind]
            if done_then.sum() < 3 or running_then.sum() < 3:
                continue
            starts = np.r_[start_finished, data.start_running][running_then]
            elapsed_then = rewind - starts
            if then_model is None:
                then = CheckpointData(
                    X_finished=data.X_finished[done_then],
                    latency_finished=latency[done_then],
                    X_running=X_all[running_then],
                    elapsed_running=elapsed_then,
                    threshold=data.threshold,
                    expected_tasks=data.expected_tasks,
                    at=rewind,
                    finish_time=finish[done_then],
                    start_running=starts,
                )
                probe = Nurd(model.regressor, model.weighting, SkillGate(self.folds), model.random_state)
                then_model = probe.fit(then)
            view = then_model.running_view(X_all[running_then])
            raw = then_model.predicted_latency(view.guess)
            ratio = model.weighting_part().ranking_weight(view.z)
            for row, strength in enumerate(STRENGTHS):
                predicted = np.maximum(raw / ratio**strength, elapsed_then) >= data.threshold
                flagged[row, running_then] |= predicted
            judged |= running_then
        if not (truth & judged).any():
            return 0.0
        base = flagged[0] & judged
        best, best_f1 = 0.0, -1.0
        for row, strength in enumerate(STRENGTHS):
            hit = flagged[row] & judged
            added = hit & ~base
            if row > 0 and not mostly_right(
                int(np.sum(added & truth)), int(np.sum(added & ~truth)), self.evidence
            ):
                continue  # no evidence that the flags it adds are mostly right
            f1 = 2 * np.sum(hit & truth) / max(int(hit.sum() + (truth & judged).sum()), 1)
            if f1 > best_f1 + 1e-9:
                best, best_f1 = strength, float(f1)
        return best


class CalibratedGate(Gate):
    """The adjusted latency as a ranking, calibrated per job from its own past (``nurd-calibrated``).

    It chooses no strength: the weighting fixes it (``nurd-calibrated``: 0, so the adjusted latency is
    h, which flags on its own). The running tasks' percentile by h / w at full strength
    (`Nurd.percentile`) becomes P(straggler) with a calibrator learned at every fit
    (`_calibrate_ranking`), and a task is flagged when it reaches ``flag_probability``. Before that,
    the percentile must pass a likelihood-ratio test at ``significance`` and the flags earlier
    candidates would have raised must be mostly right at ``evidence``; with no signal it is the
    reactive rule.

    Learned: ``rankings_`` (every fit's, carried from the model's previous ``gate_``), the acting
    ``calibrator_`` (None: none acts) and what was found, ``calibration_``.
    """

    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "rankings_": StateCodec(lambda rankings: RANKINGS.dump(rankings), lambda state: RANKINGS.load(state))
    }
    """``rankings_`` as data (`RANKINGS`, defined below with the rankings)."""
    rankings_: list[_Ranking]
    calibrator_: tuple[float, float, float] | None
    calibration_: dict[str, float]

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "evidence": [_PROBABILITY],
        "significance": [_PROBABILITY],
        "min_stragglers": [_AT_LEAST_ONE],
        "flag_probability": [_PROBABILITY],
        "max_scored": [_AT_LEAST_ONE],
    }

    def __init__(
        self,
        evidence: float = 0.85,
        significance: float = 1e-3,
        min_stragglers: int = 5,
        flag_probability: float = 0.7,
        max_scored: int = 400,
    ) -> None:
        self.evidence = evidence
        self.significance = significance
        self.min_stragglers = min_stragglers
        self.flag_probability = flag_probability
        self.max_scored = max_scored

    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        self.skill_ = 1.0
        self.strength_ = None
        previous = getattr(model, "gate_", None)
        self._calibrate_ranking(
            model, data, previous.rankings_ if isinstance(previous, CalibratedGate) else []
        )
        return self

    def _calibrate_ranking(self, model: Nurd, data: CheckpointData, previous: list[_Ranking]) -> None:
        """Learn P(straggler | prior, percentile) from this job's own past rankings whose outcome is
        known now; keep it only if the percentile adds significant evidence to the prior.

        At every fit the running tasks' percentiles and survival priors are recorded (at most
        ``max_scored`` of them) in ``rankings_``, after the ``previous`` fit's. A recorded run is
        judged once it started at least ``threshold`` ago: by then whether it straggles is known
        whatever its outcome, so the judged set is not biased toward quick finishers. A logistic
        regression of the outcome on (logit prior, percentile) is kept when a likelihood-ratio test
        against the prior alone rejects at ``significance``, with at least ``min_stragglers``
        stragglers and as many non-stragglers judged.
        """
        self.calibrator_ = None
        self.calibration_ = {"judged": 0, "stragglers": 0, "p_value": 1.0}
        past: list[_Ranking] = list(previous)
        self.rankings_ = past
        if data.at is None or data.running_ids is None or data.start_running is None:
            return
        candidate, self.calibration_ = self._candidate_calibrator(_judged(past, data))
        if data.n_running and data.n_finished:
            keep = np.arange(data.n_running)
            if len(keep) > self.max_scored:
                rng = np.random.default_rng([model.random_state, len(past)])
                keep = np.sort(rng.choice(keep, self.max_scored, replace=False))
            view = model.running_view(data.X_running)
            percentile = model.percentile(view)[keep]
            prior_logit = logit(Nurd.prior(data)[keep])
            shadow = np.full(len(keep), np.nan)
            if candidate is not None:
                a, b, c = candidate
                shadow = expit(a + b * prior_logit + c * percentile)
            ids = tuple(data.running_ids[i] for i in keep)
            past.append(_Ranking(ids, data.start_running[keep], percentile, prior_logit, shadow))
        self.calibrator_ = candidate if self.calibration_["validated"] else None

    def _candidate_calibrator(
        self, table: FloatArray
    ) -> tuple[tuple[float, float, float] | None, dict[str, float]]:
        """The calibrator the judged rows support, if any, and what was found (``calibration_``),
        whose ``validated`` says whether the flags earlier candidates would have raised were mostly
        right (`mostly_right` at confidence ``evidence``): a calibrator acts only once its
        predecessors were proven right."""
        y = table[:, 3]
        n_pos = int(y.sum())
        would_flag = table[:, 2] >= self.flag_probability  # NaN (no candidate then) compares False
        right, wrong = int(np.sum(would_flag & (y == 1))), int(np.sum(would_flag & (y == 0)))
        calibration: dict[str, float] = {
            "judged": len(y),
            "stragglers": n_pos,
            "p_value": 1.0,
            "shadow_right": right,
            "shadow_wrong": wrong,
            "validated": float(mostly_right(right, wrong, self.evidence)),
        }
        if n_pos < self.min_stragglers or len(y) - n_pos < self.min_stragglers:
            return None, calibration
        X = table[:, :2]
        prior_only = fit_logistic(X[:, :1], y, C=1e4, max_iter=500, balanced=False)
        both = fit_logistic(X, y, C=1e4, max_iter=500, balanced=False)
        gain = _log_likelihood(both, X, y) - _log_likelihood(prior_only, X[:, :1], y)
        p_value = float(chdtrc(1, 2.0 * max(gain, 0.0)))  # chi-squared sf, 1 degree of freedom
        calibration["p_value"] = p_value
        if p_value < self.significance and both.coef_[0, 1] > 0:
            return (float(both.intercept_[0]), float(both.coef_[0, 0]), float(both.coef_[0, 1])), calibration
        return None, calibration

    def scores(
        self, model: Nurd, data: CheckpointData, view: _RunningView, latency: FloatArray, weight: FloatArray
    ) -> Scores:
        """The survival prior as the probability; with an acting calibrator, the calibrated one, and a
        flag where it reaches ``flag_probability``."""
        if data.n_finished == 0:
            return super().scores(model, data, view, latency, weight)
        prior = Nurd.prior(data)
        calibrator = self.calibrator_
        if calibrator is None:
            return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight, prior)
        a, b, c = calibrator
        probability = expit(a + b * logit(prior) + c * model.percentile(view))
        flag = probability >= self.flag_probability
        return Scores.from_latency(
            latency, latency / weight, data.threshold, view.z, weight, probability, flag
        )


class SurvivalPredictor(Gate):
    """The shipped ``nurd``'s predictor, not a gate: NURD's adjusted latency read as an
    accelerated-failure-time survival model, calibrated on the job itself. It gives the policy each
    running task's probability of straggling.

    A task's latency is its lifted prediction h(x) / w(x)^``lift`` times a residual factor shared by
    the job. The factor's survival curve is Kaplan-Meier over the finished tasks' latency / h, each h
    from a fit that did not train on the task (the last fit before it finished; out-of-fold at the
    job's first fit), and the running tasks' elapsed / prediction (censored: the job's unfinished
    slow runs count). A running task's P(straggler) = P(latency >= threshold | latency >= elapsed)
    under that curve, pulled toward the job's survival prior by ``shrink`` in log-odds (1 trusts the
    model fully, 0 is the prior). The prior is ``calibration``'s (None: the shipped `PriorCalibration`,
    fixed across jobs, `straggler.core.prior_calibration`). It acts at a task's first checkpoint, with
    no labelled straggler of the job. Flags: adjusted latency h / w >= the threshold, at the strength
    the weighting fixes (the shipped nurd's `DensityWeighting` fixes 0, so w = 1 and the flag is
    h >= the threshold); it chooses none.

    Learned: ``held_out_``, each finished task's predicted log latency by a fit that did not train on
    it (by task id).
    """

    held_out_: dict[str, float]

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "folds": [Interval(Integral, 2, None, "left")],
        "min_finished": [Interval(Integral, 2, None, "left")],
        "lift": [Interval(Real, 0, None, "left")],
        "shrink": [Interval(Real, 0, 1, "both")],
        "calibration": [PriorCalibration, None],
    }

    def __init__(
        self,
        folds: int = 3,
        min_finished: int = 10,
        lift: float = 0.5,
        shrink: float = 0.2,
        calibration: PriorCalibration | None = None,
    ) -> None:
        self.folds = folds
        self.min_finished = min_finished
        self.lift = lift
        self.shrink = shrink
        self.calibration = calibration

    def calibration_part(self) -> PriorCalibration:
        return PriorCalibration() if self.calibration is None else self.calibration

    def prior(self, data: CheckpointData) -> FloatArray:
        """The job's survival prior of each running task (`Nurd.prior`), calibrated."""
        share = data.n_finished / max(data.expected_tasks, 1)
        return self.calibration_part().transform(Nurd.prior(data), share)

    def check(self, weighting: Weighting) -> None:
        super().check(weighting)
        self.calibration_part().check()
        if self.min_finished < self.folds:
            raise ValueError(f"min_finished ({self.min_finished}) must be at least folds ({self.folds})")

    def past_fits_kept(self) -> int:
        return 1

    def fit(self, model: Nurd, data: CheckpointData, past: list[Nurd], observed: FloatArray) -> Self:
        """Record, by task id, a prediction (log seconds) of every finished task by a fit that did not
        train on it, in ``held_out_``: the previous fit's for the tasks that finished since it, the
        earlier ones carried over from its ``gate_``; at a job's first fit, out-of-fold over
        ``folds`` folds (with fewer than ``min_finished`` finished tasks, the fit's own predictions)."""
        self.skill_ = 1.0
        self.strength_ = None
        self.held_out_ = {}
        if model.regressor_ is None or data.finished_ids is None:
            return self
        regressor = model.regressor_part()
        previous = past[-1] if past else None
        previous_part = previous.gate_ if previous is not None else None
        carried = previous_part.held_out_ if isinstance(previous_part, SurvivalPredictor) else {}
        if previous is None or previous.regressor_ is None or not carried:
            self.held_out_ = self._first_fit_predictions(model, data)
            return self
        since = [i for i, task in enumerate(data.finished_ids) if task not in carried]
        guess = regressor_predict(previous.regressor_, previous.scaler_.transform(data.X_finished[since]))
        self.held_out_ = {
            **carried,
            **{
                data.finished_ids[i]: float(v)
                for i, v in zip(since, regressor.log_latency(guess), strict=True)
            },
        }
        return self

    def _first_fit_predictions(self, model: Nurd, data: CheckpointData) -> dict[str, float]:
        assert model.regressor_ is not None and data.finished_ids is not None
        regressor = model.regressor_part()
        X, y = model.scaler_.transform(data.X_finished), regressor.target(data.latency_finished)
        if data.n_finished < self.min_finished:
            guess = regressor_predict(model.regressor_, X)
        else:
            guess = _out_of_fold_guess(model, X, y, self.folds)
        log_latency = regressor.log_latency(np.asarray(guess, dtype=np.float64))
        return {t: float(v) for t, v in zip(data.finished_ids, log_latency, strict=True)}

    def scores(
        self, model: Nurd, data: CheckpointData, view: _RunningView, latency: FloatArray, weight: FloatArray
    ) -> Scores:
        """The survival prior as the probability until the regressor is fitted on enough finished
        tasks; then the residual curve's probability, shrunk toward the prior."""
        if data.n_finished == 0:
            return super().scores(model, data, view, latency, weight)
        prior = self.prior(data)
        if model.regressor_ is None or data.n_finished < 5 or len(view.guess) == 0:
            return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight, prior)
        regressor = model.regressor_part()
        held_out = self.held_out_
        finished_log_h = np.full(data.n_finished, np.nan)
        if data.finished_ids is not None:
            finished_log_h[:] = [held_out.get(t, np.nan) for t in data.finished_ids]
        missing = np.isnan(finished_log_h)  # finished since this fit: its own prediction is held out too
        if missing.any():
            guess = regressor_predict(model.regressor_, model.scaler_.transform(data.X_finished[missing]))
            finished_log_h[missing] = regressor.log_latency(np.asarray(guess, dtype=np.float64))
        lift = np.log(model.weighting_part().ranking_weight(view.z))
        running_log_h = regressor.log_latency(view.guess) - self.lift * lift
        running_residual = np.exp(np.log(np.maximum(data.elapsed_running, 1e-3)) - running_log_h)
        residuals = LatencySurvival(
            np.exp(np.log(np.maximum(data.latency_finished, 1e-3)) - finished_log_h), running_residual
        )
        reach = residuals.sf(np.exp(np.log(data.threshold) - running_log_h))
        ran = residuals.sf(running_residual)
        model_p = np.clip(reach / np.maximum(ran, 1e-12), 1e-4, 1.0 - 1e-4)
        probability = expit(logit(prior) + self.shrink * (logit(model_p) - logit(prior)))
        return Scores.from_latency(latency, latency / weight, data.threshold, view.z, weight, probability)


# -- NURD -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RunningView:
    """A fit's view of some running tasks: scaled features ``X``, the regressor's ``guess`` (on its
    target's scale, unshrunk) and the propensity ``z`` (ones without a propensity model)."""

    X: FloatArray
    guess: FloatArray
    z: FloatArray


class Nurd(StragglerMethod):
    """NURD from its parts: a ``regressor``, a ``weighting`` (with its propensity model) and a
    ``gate``; None is the shipped part, so ``Nurd()`` is the shipped ``nurd``: `GradientBoostedLatency()`,
    `DensityWeighting(strength=0.0)` (flags read h alone; the predictor reads the density ratio for its
    lift) and `SurvivalPredictor()`. Parameters are stored
    as given and checked in ``fit`` (each part checks its own); learned state ends with ``_``.

    ``calibrate`` (the weighting's per-job ``offset``, the paper's centroid delta ``delta_``) runs once
    per job, called by the driver; ``fit`` calls it only on a model never calibrated (a unit test's,
    a backtest probe's), never again.
    """

    name = "nurd"
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "scaler_": STANDARDISER,
        "regressor_": optional(BOOSTER),
        "propensity_": optional(linear_model(LogisticRegression)),
    }
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "regressor": [GradientBoostedLatency, None],
        "weighting": [Weighting, None],
        "gate": [Gate, None],
        "random_state": [Interval(Integral, 0, None, "left")],
    }
    gate_: Gate
    """The fitted copy of the gate (`Gate`), which holds what it learned; declared only, so unset until
    a fit sets it."""

    def __init__(
        self,
        regressor: GradientBoostedLatency | None = None,
        weighting: Weighting | None = None,
        gate: Gate | None = None,
        random_state: int = 0,
    ) -> None:
        self.regressor = regressor
        self.weighting = weighting
        self.gate = gate
        self.random_state = random_state

    def regressor_part(self) -> GradientBoostedLatency:
        """The regressor this NURD uses (``regressor``, or the shipped one); likewise below."""
        return GradientBoostedLatency() if self.regressor is None else self.regressor

    def weighting_part(self) -> Weighting:
        return DensityWeighting(strength=0.0) if self.weighting is None else self.weighting

    def gate_part(self) -> Gate:
        return SurvivalPredictor() if self.gate is None else self.gate

    def get_params(self) -> dict[str, Any]:
        """The parameters as plain data, each part as its class name and its own parameters (what a
        stored model row is compared with, `straggler.core.model_codec`)."""
        return {
            "regressor": _described(self.regressor),
            "weighting": _described(self.weighting),
            "gate": _described(self.gate),
            "random_state": self.random_state,
        }

    def _check_params(self) -> None:
        """Raise ValueError naming the first parameter out of range, a part's included."""
        params = {name: getattr(self, name) for name in self._parameter_constraints}
        check_parameters(self._parameter_constraints, params, "Nurd")
        weighting = self.weighting_part()
        self.regressor_part().check()
        weighting.check()
        self.gate_part().check(weighting)

    # -- calibration (once per job) ------------------------------------------------------------
    def calibrate(self, data: CheckpointData) -> None:
        self.delta_ = self.weighting_part().offset(data)

    # -- learning --------------------------------------------------------------------------------
    def _past_fits(self, data: CheckpointData) -> list[Nurd]:
        """This job's previous fits (oldest first), if the gate reuses them and the data says when."""
        if not self.gate_part().past_fits_kept() or data.at is None or data.finish_time is None:
            return []
        return list(getattr(self, "history_", []))

    def fit(self, data: CheckpointData) -> Self:
        self._check_params()
        regressor, weighting, gate = self.regressor_part(), self.weighting_part(), self.gate_part()
        if not hasattr(self, "delta_"):
            self.calibrate(data)
        past = self._past_fits(data)
        observed = np.vstack([data.X_finished, data.X_running])
        self.scaler_ = Standardiser.learn(observed, observed)
        X_fin = self.scaler_.transform(data.X_finished)
        y = regressor.target(data.latency_finished)
        self.mean_target_ = float(np.mean(y)) if len(y) else 0.0
        self.regressor_: xgb.Booster | None = None
        if len(y) >= 2 and float(np.var(y)) > 1e-12:
            self.regressor_ = regressor.fit(X_fin, y, self.random_state)
        self.propensity_: LogisticRegression | None = None
        if weighting.reads_propensity and data.n_running > 0 and data.n_finished > 0:
            X_run = self.scaler_.transform(data.X_running)
            self.propensity_ = weighting.propensity_model().fit(X_fin, X_run)
        self.gate_ = copy.copy(gate).fit(self, data, past, observed)
        kept = gate.past_fits_kept()
        if kept and data.at is not None:
            self.fitted_at_ = float(data.at)
            snapshot: Nurd = copy.copy(self)
            self.history_: list[Nurd] = [*past, snapshot][-kept:]
            snapshot.history_ = []  # a fit remembers its predecessors, they do not
        return self

    # -- prediction ------------------------------------------------------------------------------
    def running_view(self, X_running: FloatArray) -> _RunningView:
        """This fit's view of running tasks with (unscaled) features ``X_running``."""
        X = self.scaler_.transform(X_running)
        z = positive_probability(self.propensity_, X) if self.propensity_ is not None else np.ones(len(X))
        guess = (
            np.full(len(X), self.mean_target_)
            if self.regressor_ is None
            else regressor_predict(self.regressor_, X).astype(np.float64)
        )
        return _RunningView(X, guess, z)

    def predicted_latency(self, guess: FloatArray) -> FloatArray:
        """Predicted latency in seconds from the regressor's ``guess``, shrunk toward the finished
        mean by the fitted gate's skill where it shrinks."""
        if self.regressor_ is not None and self.gate_.shrinks_latency:
            guess = self.mean_target_ + self.gate_.skill_ * (guess - self.mean_target_)
        return self.regressor_part().latency(guess)

    def percentile(self, view: _RunningView) -> FloatArray:
        """Percentile (near 0: fastest, near 1: slowest) of each running task by NURD's adjusted
        latency at full strength, log h(x) - log w(x): the guess, lifted where the task is unlike the
        finished ones. A rank, so it means the same before and after a refit."""
        if len(view.guess) == 0:
            return np.zeros(0)
        log_h = self.regressor_part().log_latency(view.guess)
        score = log_h - np.log(self.weighting_part().ranking_weight(view.z))
        return (rankdata(score) - 0.5) / len(score)

    @staticmethod
    def prior(data: CheckpointData) -> FloatArray:
        """P(latency >= threshold | latency >= elapsed) of each running task, from the job's survival
        curve alone (finished tasks are events, running ones censored), uncalibrated."""
        return survival_prior(data.latency_finished, data.elapsed_running, data.threshold)

    def predict(self, data: CheckpointData) -> Scores:
        if data.n_running == 0:
            empty = np.zeros(0)
            return Scores.from_latency(empty, empty, data.threshold, empty, empty)
        view = self.running_view(data.X_running)
        latency = self.predicted_latency(view.guess)
        weight = self.weighting_part().weight(view.z, self.delta_, self.gate_.strength_)
        return self.gate_.scores(self, data, view, latency, weight)

    def get_state(self) -> State:
        """Learned state, with the fitted gate's (`Gate.get_state`) and the reused past fits as data."""
        state = super().get_state()
        if "gate_" in state:
            state["gate_"] = self.gate_.get_state()
        if "history_" in state:
            state["history_"] = [fit.get_state() for fit in self.history_]
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        rest = {k: v for k, v in state.items() if k not in ("gate_", "history_")}
        super().set_state(rest)
        if "gate_" in state:
            gate = copy.copy(self.gate_part())
            if not isinstance(state["gate_"], Mapping):
                raise ValueError("a fitted gate's state is a mapping")
            gate.set_state(state["gate_"])
            self.gate_ = gate
        if "history_" in state:
            past = []
            for fit_state in state["history_"]:
                fit = Nurd(self.regressor, self.weighting, self.gate, self.random_state)
                fit.set_state(fit_state)
                past.append(fit)
            self.history_ = past

    def diagnostics(self) -> dict[str, Any]:
        """Learned quantities worth logging with a model version."""
        gate = getattr(self, "gate_", None)
        return {
            "delta": getattr(self, "delta_", None),
            "skill": getattr(gate, "skill_", None),
            "strength": getattr(gate, "strength_", None),
            "calibration": getattr(gate, "calibration_", None),
            "calibrator": getattr(gate, "calibrator_", None),
        }


def _described(part: Any) -> Any:
    """A part (and the parts it holds) as plain data: its class name and parameters; None stays."""
    if not isinstance(part, BaseEstimator):
        return part
    params = {name: _described(value) for name, value in part.get_params(deep=False).items()}
    return {"part": type(part).__name__, **params}


@dataclass(frozen=True)
class _Ranking:
    """The running tasks NURD ranked at one fit: ids, starts, percentiles and logit priors."""

    ids: tuple[str, ...]
    start: FloatArray
    percentile: FloatArray
    prior_logit: FloatArray
    shadow: FloatArray
    """The probability the candidate calibrator of that fit gave (NaN: none), to judge it later."""


def _dump_ranking(r: _Ranking) -> State:
    return {
        "ids": r.ids,
        "start": r.start,
        "percentile": r.percentile,
        "prior_logit": r.prior_logit,
        "shadow": r.shadow,
    }


def _load_ranking(state: Mapping[str, Any]) -> _Ranking:
    ids = state["ids"]
    if not isinstance(ids, tuple) or not all(isinstance(i, str) for i in ids):
        raise ValueError("a ranking's ids are a tuple of str")
    arrays = [
        np.asarray(state[k], dtype=np.float64) for k in ("start", "percentile", "prior_logit", "shadow")
    ]
    if any(a.shape != (len(ids),) for a in arrays):
        raise ValueError("a ranking's arrays do not match its ids")
    return _Ranking(ids, *arrays)


RANKINGS: StateCodec = listed(StateCodec(_dump_ranking, _load_ranking))


def _judged(rankings: list[_Ranking], data: CheckpointData) -> FloatArray:
    """Rows (logit prior, percentile, shadow probability, straggled) of the recorded rankings judged at
    ``data``: the same run (same start) of a task that started at least ``threshold`` before
    ``data.at``."""
    assert data.at is not None and data.running_ids is not None and data.start_running is not None
    now, threshold = float(data.at), data.threshold
    ids: list[str] = []
    starts: list[FloatArray] = []
    straggled: list[BoolArray] = []
    if data.finished_ids is not None and data.finish_time is not None:
        ids.extend(data.finished_ids)
        starts.append(data.finish_time - data.latency_finished)
        straggled.append(data.latency_finished >= threshold)
    running_starts = np.concatenate(
        [data.start_running, data.flagged_start if data.flagged_start is not None else []]
    )
    ids.extend((*data.running_ids, *data.flagged_ids))
    starts.append(running_starts)
    straggled.append(now - running_starts >= threshold)
    known_start, known_straggled = np.concatenate(starts), np.concatenate(straggled)
    if len(known_start) != len(ids):
        raise ValueError("a checkpoint's ids and starts differ in length")
    row_of = {task: i for i, task in enumerate(ids)}  # a task's last row: running over finished
    rows = [np.zeros((0, 4))]
    for ranking in rankings:
        found = np.array([row_of.get(task, -1) for task in ranking.ids], dtype=np.intp)
        known = found >= 0
        if not known.any():
            continue
        found = np.where(known, found, 0)
        same_run = known & (np.abs(known_start[found] - ranking.start) <= 1e-6)
        judged = same_run & (ranking.start + threshold <= now)
        rows.append(
            np.column_stack(
                [
                    ranking.prior_logit[judged],
                    ranking.percentile[judged],
                    ranking.shadow[judged],
                    known_straggled[found[judged]].astype(np.float64),
                ]
            )
        )
    return np.asarray(np.concatenate(rows), dtype=np.float64)


def _out_of_fold_guess(model: Nurd, X: FloatArray, target: FloatArray, folds: int) -> FloatArray:
    """The regressor's prediction (on its target's scale) of each row of ``X`` by a fit on the other
    folds of ``folds``, with the model's parts and seed."""
    regressor = model.regressor_part()
    guess = np.empty(len(target))
    for train, test in KFold(folds, shuffle=True, random_state=model.random_state).split(X):
        guess[test] = regressor_predict(regressor.fit(X[train], target[train], model.random_state), X[test])
    return guess


def _odds(z: FloatArray) -> FloatArray:
    """z / (1 - z): a class-balanced propensity read as the density ratio p(x | finished) / p(x | running)."""
    return z / np.maximum(1.0 - z, 1e-12)


def _log_likelihood(model: LogisticRegression, X: FloatArray, y: FloatArray) -> float:
    p = np.clip(positive_probability(model, X), 1e-12, 1.0 - 1e-12)
    return float(np.sum(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)))


PRESETS: dict[str, Callable[[int], Nurd]] = {
    "nurd": lambda random_state: Nurd(random_state=random_state),
    "nurd-calibrated": lambda random_state: Nurd(gate=CalibratedGate(), random_state=random_state),
    "nurd-backtest": lambda random_state: Nurd(
        weighting=DensityWeighting(strength=None), gate=BacktestGate(), random_state=random_state
    ),
    "nurd-paper": lambda random_state: Nurd(
        GradientBoostedLatency(log_target=False),
        PaperWeighting(LogisticPropensity(balanced=False)),
        NoGate(),
        random_state,
    ),
    "nurd-nc": lambda random_state: Nurd(
        GradientBoostedLatency(log_target=False),
        PropensityWeighting(LogisticPropensity(balanced=False)),
        NoGate(),
        random_state,
    ),
    "gbtr": lambda random_state: Nurd(
        GradientBoostedLatency(log_target=False), NoWeighting(), NoGate(), random_state
    ),
    "nurd-warm": lambda random_state: Nurd(
        weighting=DensityWeighting(strength=None),
        gate=BacktestGate(reuse_past_fits=3),
        random_state=random_state,
    ),
}
"""The compared variants by registry name, each built from its parts with a seed.

What each does: docs/architecture.md, "NURD"."""


def make_nurd(preset: str, random_state: int = 0) -> Nurd:
    """A fresh `Nurd` built as one of `PRESETS`."""
    return PRESETS[preset](random_state)
