"""The paper's baselines (§6), as `StragglerMethod`s NURD is compared against.

Each sees exactly what NURD sees (`CheckpointData`; Wrangler is also granted the true labels of 2/3 of
the job, as the paper grants it). Shared conventions: missing features are imputed with the finished
tasks' means; latency methods fill ``latency``/``adjusted``, classifiers a ``propensity`` score (higher
is more straggler-like); on degenerate input a method falls back to the reactive rule (``fallback_``),
never raises. Details: docs/architecture.md, "Baselines and START".
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np
from scipy import optimize, special
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC
from sklearn.tree import DecisionTreeClassifier

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.preprocessing import Standardiser, fill_missing, nan_column_means
from straggler.core.state import (
    BOOSTER,
    DECISION_TREE,
    STANDARDISER,
    StateCodec,
    linear_model,
    listed,
    optional,
)

#: Latencies and elapsed times are floored here (seconds) before taking logs or negating for Cox.
TIME_FLOOR = 1e-3


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def reactive_scores(data: CheckpointData, as_latency: bool) -> Scores:
    """The no-model rule: a running task is a straggler once it has run for the threshold."""
    elapsed = np.asarray(data.elapsed_running, dtype=np.float64)
    if as_latency:
        return Scores.from_latency(elapsed.copy(), elapsed.copy(), data.threshold)
    return Scores.from_labels(np.asarray(elapsed >= data.threshold, dtype=bool))


def can_learn_latency(latency_finished: FloatArray) -> bool:
    """At least 2 finished tasks with distinct latencies: the least a latency model needs."""
    finite = np.asarray(latency_finished, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return len(finite) >= 2 and float(np.ptp(finite)) > 0.0


def _quiet_fit(model: Any, X: FloatArray, y: Any, **kwargs: Any) -> Any:
    """Fit a scikit-learn model without convergence chatter: a baseline that stops at max_iter is
    still the baseline, and thousands of refits would otherwise flood the logs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y, **kwargs)


def _require_fitted(method: StragglerMethod, attribute: str) -> None:
    if not hasattr(method, attribute):
        raise RuntimeError(f"{type(method).__name__}.predict called before fit")


class _FallsBack(StragglerMethod):
    """A method whose ``fit`` sets ``fallback_`` when it has too little to learn from."""

    fallback_: bool

    def _left_to_reactive(self, data: CheckpointData) -> bool:
        """Whether this checkpoint is scored by `reactive_scores`: while the method falls back, and
        when no task runs (empty scores)."""
        _require_fitted(self, "fallback_")
        return self.fallback_ or data.n_running == 0


# --------------------------------------------------------------------------------------------------
# Systems baselines
# --------------------------------------------------------------------------------------------------


class Reactive(StragglerMethod):
    """Speculative execution as deployed (Hadoop/Spark): no model, latency = elapsed time, so a task
    is flagged only once it has actually run for the threshold. The floor every method must beat."""

    name: ClassVar[str] = "reactive"
    predicts_latency: ClassVar[bool] = True

    def __init__(self) -> None:
        """No parameters (declared so ``get_params`` finds none rather than object's ``*args``)."""

    def fit(self, data: CheckpointData) -> Self:
        self.fallback_ = False
        return self

    def predict(self, data: CheckpointData) -> Scores:
        """Elapsed time as the latency; the straggle probability 1 past the threshold, and none below
        it: elapsed time alone does not tell a task that will straggle from one that will not."""
        elapsed = np.asarray(data.elapsed_running, dtype=np.float64)
        probability = np.where(elapsed >= data.threshold, 1.0, np.nan)
        return Scores.from_latency(elapsed.copy(), elapsed.copy(), data.threshold, probability=probability)


class Wrangler(StragglerMethod):
    """Wrangler (Yadwadkar et al., 2014): a linear SVM on standardised features, the straggler
    class randomly oversampled to balance. As in the paper it is trained once, on true labels of a
    random 2/3 of the job granted by the evaluator; ``fit`` does nothing after that.

    Features are imputed and scaled with the granted sample's statistics (its training set).
    Degenerate grants: an empty sample predicts "not a straggler"; a single-class sample predicts
    that class for every task. ``predict`` before any grant is a driver bug and raises.
    """

    name: ClassVar[str] = "wrangler"
    predicts_latency: ClassVar[bool] = False
    needs_granted_labels: ClassVar[bool] = True
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "scaler_": STANDARDISER,
        "model_": optional(linear_model(LinearSVC)),
    }

    def __init__(self, C: float = 1.0, max_iter: int = 5000, random_state: int = 0) -> None:
        self.C = C
        self.max_iter = max_iter
        self.random_state = random_state

    def grant_labels(self, X: FloatArray, is_straggler: BoolArray) -> None:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(is_straggler, dtype=bool)
        self.scaler_ = Standardiser.learn(X)
        self.model_: Any = None
        classes = np.unique(y)
        self.constant_class_: bool | None = None
        if len(classes) < 2:
            self.constant_class_ = bool(classes[0]) if len(classes) == 1 else False
            return
        X_bal, y_bal = _oversample_minority(self.scaler_.transform(X), y, self.random_state)
        self.model_ = _quiet_fit(
            LinearSVC(C=self.C, max_iter=self.max_iter, random_state=self.random_state), X_bal, y_bal
        )

    def fit(self, data: CheckpointData) -> Self:
        self.fallback_ = False
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if not hasattr(self, "scaler_"):
            raise RuntimeError("Wrangler needs grant_labels(X, is_straggler) before predict")
        n = data.n_running
        if self.constant_class_ is not None:
            return Scores.from_labels(np.full(n, self.constant_class_, dtype=bool))
        if n == 0:
            return Scores.from_labels(np.zeros(0, dtype=bool))
        margin = self.model_.decision_function(self.scaler_.transform(data.X_running))
        return Scores.from_labels(np.asarray(margin > 0, dtype=bool), np.asarray(margin, dtype=np.float64))


def _oversample_minority(X: FloatArray, y: BoolArray, random_state: int) -> tuple[FloatArray, BoolArray]:
    """Draw extra minority-class rows with replacement until both classes are equally frequent."""
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    minority = bool(n_pos < n_neg)
    deficit = abs(n_pos - n_neg)
    if deficit == 0:
        return X, y
    rng = np.random.default_rng(random_state)
    extra = rng.choice(np.flatnonzero(y == minority), size=deficit, replace=True)
    return np.vstack([X, X[extra]]), np.concatenate([y, y[extra]])


# --------------------------------------------------------------------------------------------------
# Positive-unlabeled learning: finished tasks are the labeled class, running tasks are unlabeled
# --------------------------------------------------------------------------------------------------


class _PULearner(_FallsBack):
    """What the two PU learners share: finished tasks are the labelled class, running ones unlabelled."""

    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "scaler_": STANDARDISER,
        "model_": linear_model(LogisticRegression),
    }

    random_state: int

    def fit(self, data: CheckpointData) -> Self:
        """Scale both classes with what the checkpoint shows, then learn from them (`_fit_classes`);
        with fewer than 2 finished tasks or nothing running to contrast with, ``fallback_``."""
        self.fallback_ = data.n_finished < 2 or data.n_running == 0
        if self.fallback_:
            return self
        self.scaler_ = Standardiser.learn(data.X_finished, np.vstack([data.X_finished, data.X_running]))
        Z_fin, Z_run = self.scaler_.transform(data.X_finished), self.scaler_.transform(data.X_running)
        self._fit_classes(data, Z_fin, Z_run, np.random.default_rng(self.random_state))
        return self

    def _fit_classes(
        self, data: CheckpointData, Z_fin: FloatArray, Z_run: FloatArray, rng: np.random.Generator
    ) -> None:
        raise NotImplementedError


class PUElkanNoto(_PULearner):
    """PU learning after Elkan & Noto (2008), with finished tasks as the labeled ("positive") class.

    A logistic regression g(x) = P(finished | x) is trained on finished vs running tasks, holding out
    a fraction of the finished ones; c = mean g over the held-out finished tasks estimates
    P(finished | finished-like); g(x)/c (clipped to [0, 1]) is then P(finished-like | x), and a
    running task with P < 0.5 is a straggler. ``propensity`` = 1 - P.

    Falls back to the reactive rule with fewer than 2 finished tasks or no running task at fit
    time (nothing unlabeled to contrast with).
    """

    name: ClassVar[str] = "pu-en"
    predicts_latency: ClassVar[bool] = False

    def __init__(self, hold_out_ratio: float = 0.1, C: float = 1.0, random_state: int = 0) -> None:
        self.hold_out_ratio = hold_out_ratio
        self.C = C
        self.random_state = random_state

    def _fit_classes(
        self, data: CheckpointData, Z_fin: FloatArray, Z_run: FloatArray, rng: np.random.Generator
    ) -> None:
        n_fin, n_run = len(Z_fin), len(Z_run)
        n_hold = min(max(1, round(self.hold_out_ratio * n_fin)), n_fin - 1)
        order = rng.permutation(n_fin)
        held, kept = order[:n_hold], order[n_hold:]
        X_train = np.vstack([Z_fin[kept], Z_run])
        s_train = np.concatenate([np.ones(len(kept), dtype=int), np.zeros(n_run, dtype=int)])
        self.model_: Any = _quiet_fit(LogisticRegression(C=self.C, max_iter=1000), X_train, s_train)
        self.c_ = max(float(self.model_.predict_proba(Z_fin[held])[:, 1].mean()), 1e-12)

    def predict(self, data: CheckpointData) -> Scores:
        if self._left_to_reactive(data):
            return reactive_scores(data, as_latency=False)
        g = self.model_.predict_proba(self.scaler_.transform(data.X_running))[:, 1]
        p_finished_like = np.clip(g / self.c_, 0.0, 1.0)
        return Scores.from_labels(np.asarray(p_finished_like < 0.5, dtype=bool), 1.0 - p_finished_like)


class PUBagging(_PULearner):
    """Bagging PU learning after Mordelet & Vert (2014), finished tasks as the labeled class.

    Each of ``n_estimators`` rounds draws a bootstrap of the running tasks (size = min(#finished,
    #running)) and trains a class-balanced decision tree, finished vs that bootstrap (trees split on
    random feature subsets, ``max_features``, which keeps a refit in tens of ms); each running
    task's P(finished-like) is the average over the rounds where it was out of bag (all rounds if
    it never was). A running task with P < 0.5 is a straggler; ``propensity`` = 1 - P.

    The running tasks scored are those seen at ``fit``; at a later ``predict`` without refit, tasks
    are scored by the average of all trees. Falls back to the reactive rule with fewer than 2
    finished tasks or no running task at fit time.
    """

    name: ClassVar[str] = "pu-bg"
    predicts_latency: ClassVar[bool] = False
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "scaler_": STANDARDISER,
        "trees_": listed(DECISION_TREE),
    }

    def __init__(
        self,
        n_estimators: int = 20,
        max_depth: int | None = 6,
        max_features: str | float | None = "sqrt",
        random_state: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.max_features = max_features
        self.random_state = random_state

    def _fit_classes(
        self, data: CheckpointData, Z_fin: FloatArray, Z_run: FloatArray, rng: np.random.Generator
    ) -> None:
        n_fin, n_run = len(Z_fin), len(Z_run)
        sample_size = min(n_fin, n_run)
        self.trees_: list[Any] = []
        oob_sum = np.zeros(n_run)
        oob_count = np.zeros(n_run)
        for _ in range(self.n_estimators):
            bag = rng.integers(0, n_run, size=sample_size)
            X_train = np.vstack([Z_fin, Z_run[bag]])
            y_train = np.concatenate([np.ones(n_fin, dtype=int), np.zeros(sample_size, dtype=int)])
            tree = DecisionTreeClassifier(
                max_depth=self.max_depth,
                max_features=self.max_features,
                class_weight="balanced",
                random_state=int(rng.integers(0, 2**31 - 1)),
            ).fit(X_train, y_train)
            self.trees_.append(tree)
            out_of_bag = np.ones(n_run, dtype=bool)
            out_of_bag[bag] = False
            if out_of_bag.any():
                oob_sum[out_of_bag] += _finished_probability(tree, Z_run[out_of_bag])
                oob_count[out_of_bag] += 1
        # Out-of-bag scores belong to the exact running set seen here; kept keyed by its content.
        self.oob_p_: FloatArray = np.divide(
            oob_sum, oob_count, out=np.full(n_run, np.nan), where=oob_count > 0
        )
        self.fit_key_ = _running_key(data)

    def predict(self, data: CheckpointData) -> Scores:
        if self._left_to_reactive(data):
            return reactive_scores(data, as_latency=False)
        Z_run = self.scaler_.transform(data.X_running)
        p_all = np.mean([_finished_probability(tree, Z_run) for tree in self.trees_], axis=0)
        if _running_key(data) == self.fit_key_:
            p = np.where(np.isfinite(self.oob_p_), self.oob_p_, p_all)
        else:
            p = p_all
        return Scores.from_labels(np.asarray(p < 0.5, dtype=bool), 1.0 - p)


def _finished_probability(tree: Any, X: FloatArray) -> FloatArray:
    proba = tree.predict_proba(X)
    classes = list(tree.classes_)
    return np.asarray(proba[:, classes.index(1)], dtype=np.float64)


def _running_key(data: CheckpointData) -> bytes:
    """Identifies a running set so out-of-bag scores are only reused for the tasks they describe."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.ascontiguousarray(data.X_running, dtype=np.float64).tobytes())
    digest.update(np.ascontiguousarray(data.elapsed_running, dtype=np.float64).tobytes())
    return digest.digest()


# --------------------------------------------------------------------------------------------------
# Censored and survival regression: running tasks are right-censored at their elapsed time
# --------------------------------------------------------------------------------------------------


class Tobit(StragglerMethod):
    """Tobit (Tobin, 1958): linear Gaussian regression of log latency, running tasks right-censored
    at log(elapsed). (beta, log sigma) by maximum likelihood (L-BFGS-B, analytic gradient) with a
    small ridge penalty on the slopes, which keeps the MLE finite when a feature separates running
    from finished tasks.

    Prediction: the conditional median of the latency given it exceeds the elapsed time,
    exp(q) with P(log L > q | log L > log elapsed, x) = 1/2. The median commutes with exp, so this
    is the model's median latency (a mean of log latency mapped back would be a geometric mean),
    and ``latency >= threshold`` iff P(L >= threshold | L > elapsed, x) >= 1/2.

    Falls back to the reactive rule without 2 finished tasks of distinct latency.
    """

    name: ClassVar[str] = "tobit"
    predicts_latency: ClassVar[bool] = True
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {"scaler_": STANDARDISER}

    def __init__(self, alpha: float = 1.0, max_iter: int = 200) -> None:
        self.alpha = alpha
        self.max_iter = max_iter

    def fit(self, data: CheckpointData) -> Self:
        self.fallback_ = not can_learn_latency(data.latency_finished)
        if self.fallback_:
            return self
        self.scaler_ = Standardiser.learn(data.X_finished, np.vstack([data.X_finished, data.X_running]))
        Z = np.vstack([self.scaler_.transform(data.X_finished), self.scaler_.transform(data.X_running)])
        design = np.hstack([np.ones((len(Z), 1)), Z])
        y = np.log(np.maximum(np.concatenate([data.latency_finished, data.elapsed_running]), TIME_FLOOR))
        censored = np.concatenate(
            [np.zeros(data.n_finished, dtype=bool), np.ones(data.n_running, dtype=bool)]
        )
        y_obs = y[~censored]
        theta0 = np.zeros(design.shape[1] + 1)
        theta0[0] = y_obs.mean()
        theta0[-1] = np.log(max(float(y_obs.std()), 1e-3))
        result = optimize.minimize(
            _tobit_objective,
            theta0,
            args=(design, y, censored, self.alpha),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": self.max_iter},
        )
        self.coef_: FloatArray = np.asarray(result.x[:-1], dtype=np.float64)
        self.sigma_ = float(np.exp(result.x[-1]))
        self.converged_ = bool(result.success)
        return self

    def predict(self, data: CheckpointData) -> Scores:
        _require_fitted(self, "fallback_")
        if self.fallback_:
            return reactive_scores(data, as_latency=True)
        Z = self.scaler_.transform(data.X_running)
        mu = self.coef_[0] + Z @ self.coef_[1:]
        log_elapsed = np.log(np.maximum(data.elapsed_running, TIME_FLOOR))
        q = conditional_log_median(mu, self.sigma_, log_elapsed)
        latency = np.exp(np.minimum(q, 700.0))
        return Scores.from_latency(latency, latency.copy(), data.threshold)


def conditional_log_median(mu: FloatArray, sigma: float, lower: FloatArray) -> FloatArray:
    """Median of N(mu, sigma^2) truncated to (lower, inf), stable far in the tail.

    Solves S(q) = S(lower) / 2 with S the Gaussian survival function, in log space so a task that
    has run many sigmas past its mean still gets a finite answer just above ``lower``.
    """
    a = (lower - mu) / sigma
    log_half_tail = np.log(0.5) + special.log_ndtr(-a)
    return np.asarray(mu - sigma * special.ndtri_exp(log_half_tail), dtype=np.float64)


def _tobit_objective(
    theta: FloatArray, design: FloatArray, y: FloatArray, censored: BoolArray, alpha: float
) -> tuple[float, FloatArray]:
    """Negative log-likelihood of right-censored Gaussian regression and its gradient.

    theta = (intercept, slopes..., log sigma); the ridge term skips the intercept.
    """
    beta, log_sigma = theta[:-1], theta[-1]
    sigma = np.exp(log_sigma)
    z = (y - design @ beta) / sigma
    obs = ~censored
    z_obs, a = z[obs], z[censored]
    log_tail = special.log_ndtr(-a)
    nll = float(np.sum(log_sigma + 0.5 * z_obs**2) - np.sum(log_tail))
    # d/dmu and d/dlog_sigma of each term
    d_mu = np.empty_like(z)
    d_log_sigma = np.empty_like(z)
    d_mu[obs] = -z_obs / sigma
    d_log_sigma[obs] = 1.0 - z_obs**2
    hazard = np.exp(-0.5 * a**2 - 0.5 * np.log(2 * np.pi) - log_tail)  # phi(a) / (1 - Phi(a))
    d_mu[censored] = -hazard / sigma
    d_log_sigma[censored] = -hazard * a
    grad_beta = design.T @ d_mu
    slopes = beta[1:]
    nll += 0.5 * alpha * float(slopes @ slopes)
    grad_beta[1:] += alpha * slopes
    return nll, np.concatenate([grad_beta, [d_log_sigma.sum()]])


def _xgb_params(objective: str, max_depth: int, learning_rate: float, random_state: int) -> dict[str, Any]:
    return {
        "objective": objective,
        "tree_method": "hist",
        "max_depth": max_depth,
        "eta": learning_rate,
        "nthread": 1,
        "seed": random_state,
        "verbosity": 0,
    }


class _BoostedSurvival(_FallsBack):
    """An XGBoost survival model on finished (events) and running (censored) tasks; the reactive rule
    until 2 finished tasks of distinct latency, and when no task runs."""

    state_codecs: ClassVar[Mapping[str, StateCodec]] = {"booster_": BOOSTER}

    def _learns(self, data: CheckpointData) -> bool:
        """Set ``fallback_`` (too little to learn from) and, when it learns, the missing-value fill."""
        self.fallback_ = not can_learn_latency(data.latency_finished)
        if not self.fallback_:
            self.fill_ = nan_column_means(data.X_finished)
        return not self.fallback_

    def _matrix(self, X: FloatArray) -> Any:
        """``X`` with missing values filled, as XGBoost's DMatrix."""
        import xgboost as xgb

        return xgb.DMatrix(fill_missing(X, self.fill_))


class Grabit(_BoostedSurvival):
    """Grabit (Sigrist & Hirnschall, 2019), here as XGBoost's accelerated-failure-time objective
    with Gaussian noise on log latency: finished tasks are exact intervals [L, L], running tasks
    right-censored intervals [elapsed, +inf).

    Times are divided by the finished tasks' median latency before training (so boosting starts
    near the answer whatever the job's time scale) and multiplied back after. The prediction is
    XGBoost's ``predict`` under ``survival:aft``: exp(T(x)), the median of the fitted log-normal
    latency given x (unconditional on elapsed; the driver floors it at elapsed). ``sigma`` is
    XGBoost's ``aft_loss_distribution_scale``, fixed, not learned.

    Falls back to the reactive rule without 2 finished tasks of distinct latency.
    """

    name: ClassVar[str] = "grabit"
    predicts_latency: ClassVar[bool] = True

    def __init__(
        self,
        n_estimators: int = 50,
        max_depth: int = 4,
        learning_rate: float = 0.1,
        sigma: float = 1.0,
        random_state: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.sigma = sigma
        self.random_state = random_state

    def fit(self, data: CheckpointData) -> Self:
        import xgboost as xgb

        if not self._learns(data):
            return self
        self.time_scale_ = float(np.median(np.maximum(data.latency_finished, TIME_FLOOR)))
        finished = np.maximum(data.latency_finished, TIME_FLOOR) / self.time_scale_
        running = np.maximum(data.elapsed_running, TIME_FLOOR) / self.time_scale_
        dtrain = self._matrix(np.vstack([data.X_finished, data.X_running]))
        dtrain.set_float_info("label_lower_bound", np.concatenate([finished, running]))
        dtrain.set_float_info("label_upper_bound", np.concatenate([finished, np.full(len(running), np.inf)]))
        params = _xgb_params("survival:aft", self.max_depth, self.learning_rate, self.random_state)
        params |= {
            "aft_loss_distribution": "normal",
            "aft_loss_distribution_scale": self.sigma,
            "base_score": 1.0,
        }
        self.booster_: Any = xgb.train(params, dtrain, num_boost_round=self.n_estimators)
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if self._left_to_reactive(data):
            return reactive_scores(data, as_latency=True)
        dtest = self._matrix(data.X_running)
        latency = np.asarray(self.booster_.predict(dtest), dtype=np.float64) * self.time_scale_
        return Scores.from_latency(latency, latency.copy(), data.threshold)


class CoxPH(_BoostedSurvival):
    """Cox proportional hazards with a boosted risk score: XGBoost ``survival:cox`` (label = latency
    for finished tasks, -elapsed for running ones, i.e. right-censored) gives the hazard ratio r(x);
    the Breslow estimator over the same training data gives the baseline cumulative hazard H0.

    For a running task, P(L > threshold | L > elapsed, x) = exp(-r(x) (H0(threshold) - H0(elapsed)));
    it is a straggler when that is >= 1/2. The probability goes in ``propensity``; ``latency`` and
    ``adjusted`` stay NaN, because the Breslow curve is flat past the last finish and a conditional
    median would be infinite for exactly the tasks that matter. For the same reason a threshold
    beyond every finished latency is read as "outlives the last finish seen so far".

    Falls back to the reactive rule without 2 finished tasks of distinct latency.
    """

    name: ClassVar[str] = "coxph"
    predicts_latency: ClassVar[bool] = False

    def __init__(
        self, n_estimators: int = 50, max_depth: int = 4, learning_rate: float = 0.1, random_state: int = 0
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.random_state = random_state

    def fit(self, data: CheckpointData) -> Self:
        import xgboost as xgb

        if not self._learns(data):
            return self
        times = np.maximum(np.concatenate([data.latency_finished, data.elapsed_running]), TIME_FLOOR)
        event = np.concatenate([np.ones(data.n_finished, dtype=bool), np.zeros(data.n_running, dtype=bool)])
        dtrain = self._matrix(np.vstack([data.X_finished, data.X_running]))
        dtrain.set_label(np.where(event, times, -times))
        params = _xgb_params("survival:cox", self.max_depth, self.learning_rate, self.random_state)
        self.booster_: Any = xgb.train(params, dtrain, num_boost_round=self.n_estimators)
        margin = np.asarray(self.booster_.predict(dtrain, output_margin=True), dtype=np.float64)
        # Hazard ratios are relative: any offset cancels between H0 and r(x); this one keeps exp() <= 1.
        self.margin_offset_ = float(margin.max())
        self.event_times_, self.cumulative_hazard_ = breslow_baseline(
            times, event, np.exp(margin - self.margin_offset_)
        )
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if self._left_to_reactive(data):
            return reactive_scores(data, as_latency=False)
        dtest = self._matrix(data.X_running)
        margin = np.asarray(self.booster_.predict(dtest, output_margin=True), dtype=np.float64)
        risk = np.exp(np.minimum(margin - self.margin_offset_, 50.0))
        elapsed = np.maximum(data.elapsed_running, TIME_FLOOR)
        h_gap = np.maximum(self._h0(np.full(len(elapsed), data.threshold)) - self._h0(elapsed), 0.0)
        p_past_threshold = np.where(np.isnan(data.threshold), np.nan, np.exp(-risk * h_gap))
        return Scores.from_labels(np.asarray(p_past_threshold >= 0.5, dtype=bool), p_past_threshold)

    def _h0(self, t: FloatArray) -> FloatArray:
        """Right-continuous step function H0(t): hazard accumulated by events at times <= t."""
        index = np.searchsorted(self.event_times_, t, side="right")
        return np.asarray(np.concatenate([[0.0], self.cumulative_hazard_])[index], dtype=np.float64)


def breslow_baseline(times: FloatArray, event: BoolArray, risk: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Breslow estimate of the baseline cumulative hazard of a proportional-hazards model.

    At each distinct event time t, H0 jumps by (events at t) / (sum of risk over subjects with
    time >= t). Returns the sorted distinct event times and H0 just after each.
    """
    order = np.argsort(times, kind="stable")
    t_sorted, risk_sorted, event_sorted = times[order], risk[order], event[order]
    at_risk_from = np.cumsum(risk_sorted[::-1])[::-1]  # sum of risk over positions >= i
    event_times, n_events = np.unique(t_sorted[event_sorted], return_counts=True)
    first_at_or_after = np.searchsorted(t_sorted, event_times, side="left")
    jumps = n_events / at_risk_from[first_at_or_after]
    return np.asarray(event_times, dtype=np.float64), np.cumsum(jumps)


BASELINES: dict[str, type[StragglerMethod]] = {
    cls.name: cls for cls in (Reactive, Wrangler, PUElkanNoto, PUBagging, Tobit, Grabit, CoxPH)
}
"""Baselines by registry name; the outlier detectors live in `straggler.core.outliers`."""
