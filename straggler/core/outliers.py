"""The paper's outlier-detection baselines (Table 3): PyOD detectors that know nothing of latency.

Each detector learns the finished tasks' features as the nominal population and flags outlying running
tasks at contamination 0.1 (transductive SOS, COF, SOD: cut at the finished tasks' 90th percentile
score). PyOD (extra ``outliers``) is imported at ``fit``; the stored state is the scaler and the
population, and `set_state` refits the deterministic detector. Fallback: the reactive rule.

Details: docs/architecture.md, "Baselines and START".
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Self

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from straggler.core.arrays import FloatArray
from straggler.core.baselines import reactive_scores
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.preprocessing import Standardiser
from straggler.core.state import STANDARDISER, State, StateCodec

_MISSING_PYOD = "the outlier-detection baselines need PyOD: pip install 'straggler-stream[outliers]'"

#: Errors by which PyOD detectors report data they cannot model; anything else is a bug and raises.
_UNFITTABLE = (ValueError, np.linalg.LinAlgError, FloatingPointError)


def pyod_class(module: str, class_name: str) -> Any:
    """``pyod.models.<module>.<class_name>``, or an ImportError that names the extra to install."""
    try:
        return getattr(importlib.import_module(f"pyod.models.{module}"), class_name)
    except ImportError as error:
        raise ImportError(_MISSING_PYOD) from error


@contextmanager
def _quiet_pyod() -> Iterator[None]:
    """Silence PyOD's and scikit-learn's advisory warnings (small neighbourhoods, constant inputs,
    MCD rank), which would otherwise repeat at every refit of every job."""
    with warnings.catch_warnings():
        for category in (UserWarning, RuntimeWarning, ConvergenceWarning):
            warnings.simplefilter("ignore", category)
        yield


class PyODDetector(StragglerMethod):
    """Base of the detector baselines: subclasses say which PyOD class and how to build it."""

    predicts_latency: ClassVar[bool] = False
    #: PyOD scores X only against X itself (see module docstring)
    transductive: ClassVar[bool] = False
    #: fewer finished tasks than this and the detector falls back to the reactive rule
    min_reference: ClassVar[int] = 10
    detector_: Any

    def __init__(
        self, contamination: float = 0.1, max_reference: int | None = None, random_state: int = 0
    ) -> None:
        self.contamination = contamination
        self.max_reference = max_reference
        self.random_state = random_state

    state_codecs: ClassVar[Mapping[str, StateCodec]] = {"scaler_": STANDARDISER}

    def build(self, n_reference: int) -> Any:
        """A fresh PyOD detector for ``n_reference`` nominal rows (neighbourhoods capped below it)."""
        raise NotImplementedError

    def get_state(self) -> State:
        """Learned state without the detector: `set_state` refits it on ``reference_``."""
        state = super().get_state()
        detector = state.pop("detector_", None)
        rng = getattr(detector, "random_state", None)
        if isinstance(rng, np.random.RandomState):  # LSCP draws from it at every decision_function
            state["detector_rng_"] = rng.get_state(legacy=True)
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore the scaler and population, and refit the detector on the population (deterministic)."""
        if "detector_" in state:
            raise ValueError("a detector is refitted, never stored")
        rng = state.get("detector_rng_")
        super().set_state({k: v for k, v in state.items() if k != "detector_rng_"})
        if not self.transductive and state.get("fallback_") is False:
            reference = np.asarray(self.reference_, dtype=np.float64)
            with _quiet_pyod():
                self.detector_ = self.fit_detector(reference)
            if rng is not None:
                self.detector_.random_state.set_state(rng)

    def fit_detector(self, Z: FloatArray) -> Any:
        """Fit a fresh detector on ``Z``; overridden where a detector needs a second attempt."""
        return self.build(len(Z)).fit(Z)

    def fit(self, data: CheckpointData) -> Self:
        self.fallback_ = True
        if data.n_finished < max(self.min_reference, 2):
            return self
        X_ref = np.asarray(data.X_finished, dtype=np.float64)
        if self.max_reference is not None and len(X_ref) > self.max_reference:
            rng = np.random.default_rng(self.random_state)
            X_ref = X_ref[np.sort(rng.choice(len(X_ref), size=self.max_reference, replace=False))]
        self.scaler_ = Standardiser.learn(X_ref)
        if not self.scaler_.varying.any():
            return self
        self.reference_ = self.scaler_.transform(X_ref)[:, self.scaler_.varying]
        if self.transductive:
            self.build(len(self.reference_))  # the work happens at predict; fail here if PyOD is missing
        else:
            with _quiet_pyod():
                try:
                    self.detector_ = self.fit_detector(self.reference_)
                except _UNFITTABLE:
                    return self
        self.fallback_ = False
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if not hasattr(self, "fallback_"):
            raise RuntimeError(f"{type(self).__name__}.predict called before fit")
        if self.fallback_:
            return reactive_scores(data, as_latency=False)
        if data.n_running == 0:
            return Scores.from_labels(np.zeros(0, dtype=bool))
        Z_run = self.scaler_.transform(data.X_running)[:, self.scaler_.varying]
        with _quiet_pyod():
            try:
                score, cutoff = self._score(Z_run)
            except _UNFITTABLE:
                return reactive_scores(data, as_latency=False)
        return Scores.from_labels(np.asarray(score > cutoff, dtype=bool), score)

    def _score(self, Z_run: FloatArray) -> tuple[FloatArray, float]:
        """Outlier scores of the running tasks (higher = more outlying) and the straggler cut-off."""
        if not self.transductive:
            score = np.asarray(self.detector_.decision_function(Z_run), dtype=np.float64)
            return score, float(self.detector_.threshold_)
        n_ref = len(self.reference_)
        together = np.vstack([self.reference_, Z_run])
        all_scores = np.asarray(self.fit_detector(together).decision_scores_, dtype=np.float64)
        cutoff = float(np.percentile(all_scores[:n_ref], 100 * (1 - self.contamination)))
        return all_scores[n_ref:], cutoff


class _CostlyPyODDetector(PyODDetector):
    """Detectors quadratic in the reference size (or worse): the nominal population is a seeded
    random sample of at most 300 finished tasks by default, so a refit stays well under a second."""

    def __init__(
        self, contamination: float = 0.1, max_reference: int | None = 300, random_state: int = 0
    ) -> None:
        super().__init__(contamination=contamination, max_reference=max_reference, random_state=random_state)


def _neighbours(default: int, n_reference: int) -> int:
    return max(1, min(default, n_reference - 1))


class ABODDetector(PyODDetector):
    """Angle-based outlier detection (Kriegel et al., 2008), PyOD's fast k-NN variant."""

    name: ClassVar[str] = "od-abod"

    def build(self, n_reference: int) -> Any:
        return pyod_class("abod", "ABOD")(
            contamination=self.contamination, n_neighbors=_neighbours(5, n_reference)
        )


class CBLOFDetector(PyODDetector):
    """Cluster-based local outlier factor (He et al., 2003).

    PyOD's default split (large clusters hold 90 % of the data) does not exist when k-means finds
    clusters of similar size; the fit is then retried with a 50 % split, which always exists.
    """

    name: ClassVar[str] = "od-cblof"

    def build(self, n_reference: int, alpha: float = 0.9) -> Any:
        return pyod_class("cblof", "CBLOF")(
            contamination=self.contamination,
            n_clusters=max(2, min(8, n_reference // 2)),
            alpha=alpha,
            random_state=self.random_state,
        )

    def fit_detector(self, Z: FloatArray) -> Any:
        try:
            return self.build(len(Z)).fit(Z)
        except ValueError:
            return self.build(len(Z), alpha=0.5).fit(Z)


class HBOSDetector(PyODDetector):
    """Histogram-based outlier score (Goldstein & Dengel, 2012)."""

    name: ClassVar[str] = "od-hbos"

    def build(self, n_reference: int) -> Any:
        return pyod_class("hbos", "HBOS")(contamination=self.contamination)


class IForestDetector(PyODDetector):
    """Isolation forest (Liu et al., 2008)."""

    name: ClassVar[str] = "od-iforest"

    def build(self, n_reference: int) -> Any:
        return pyod_class("iforest", "IForest")(
            contamination=self.contamination, random_state=self.random_state, n_jobs=1
        )


class KNNDetector(PyODDetector):
    """Distance to the k-th nearest neighbour (Ramaswamy et al., 2000)."""

    name: ClassVar[str] = "od-knn"

    def build(self, n_reference: int) -> Any:
        return pyod_class("knn", "KNN")(
            contamination=self.contamination, n_neighbors=_neighbours(5, n_reference)
        )


class LOFDetector(PyODDetector):
    """Local outlier factor (Breunig et al., 2000)."""

    name: ClassVar[str] = "od-lof"

    def build(self, n_reference: int) -> Any:
        return pyod_class("lof", "LOF")(
            contamination=self.contamination, n_neighbors=_neighbours(20, n_reference)
        )


class MCDDetector(_CostlyPyODDetector):
    """Minimum covariance determinant: robust Mahalanobis distance (Hardin & Rocke, 2004)."""

    name: ClassVar[str] = "od-mcd"

    def build(self, n_reference: int) -> Any:
        return pyod_class("mcd", "MCD")(contamination=self.contamination, random_state=self.random_state)


class OCSVMDetector(PyODDetector):
    """One-class SVM with an RBF kernel (Schölkopf et al., 2001)."""

    name: ClassVar[str] = "od-ocsvm"

    def build(self, n_reference: int) -> Any:
        return pyod_class("ocsvm", "OCSVM")(contamination=self.contamination)


class PCADetector(PyODDetector):
    """Weighted distance to the principal subspace (Shyu et al., 2003)."""

    name: ClassVar[str] = "od-pca"

    def build(self, n_reference: int) -> Any:
        return pyod_class("pca", "PCA")(contamination=self.contamination, random_state=self.random_state)


class SOSDetector(_CostlyPyODDetector):
    """Stochastic outlier selection (Janssens et al., 2012); transductive in PyOD."""

    name: ClassVar[str] = "od-sos"
    transductive: ClassVar[bool] = True

    def build(self, n_reference: int) -> Any:
        return pyod_class("sos", "SOS")(contamination=self.contamination)


class LSCPDetector(_CostlyPyODDetector):
    """Locally selective combination of LOF detectors with different neighbourhoods (Zhao et al.,
    2019); PyOD has no default ensemble, so this one spans small to large neighbourhoods."""

    name: ClassVar[str] = "od-lscp"

    def build(self, n_reference: int) -> Any:
        lof = pyod_class("lof", "LOF")
        members = [lof(n_neighbors=_neighbours(k, n_reference)) for k in (5, 10, 20, 30)]
        return pyod_class("lscp", "LSCP")(
            members,
            local_region_size=_neighbours(30, n_reference),
            contamination=self.contamination,
            random_state=self.random_state,
        )


class COFDetector(_CostlyPyODDetector):
    """Connectivity-based outlier factor (Tang et al., 2002); transductive in PyOD."""

    name: ClassVar[str] = "od-cof"
    transductive: ClassVar[bool] = True

    def build(self, n_reference: int) -> Any:
        return pyod_class("cof", "COF")(
            contamination=self.contamination, n_neighbors=_neighbours(20, n_reference)
        )


class SODDetector(_CostlyPyODDetector):
    """Subspace outlier detection (Kriegel et al., 2009); transductive in PyOD."""

    name: ClassVar[str] = "od-sod"
    transductive: ClassVar[bool] = True

    def build(self, n_reference: int) -> Any:
        n_neighbors = _neighbours(20, n_reference)
        return pyod_class("sod", "SOD")(
            contamination=self.contamination,
            n_neighbors=n_neighbors,
            ref_set=max(1, min(10, n_neighbors - 1)),
        )


OUTLIER_DETECTORS: dict[str, type[StragglerMethod]] = {
    cls.name: cls
    for cls in (
        ABODDetector,
        CBLOFDetector,
        HBOSDetector,
        IForestDetector,
        KNNDetector,
        LOFDetector,
        MCDDetector,
        OCSVMDetector,
        PCADetector,
        SOSDetector,
        LSCPDetector,
        COFDetector,
        SODDetector,
    )
}
"""Outlier-detection baselines by registry name (need the ``outliers`` extra at fit time)."""
