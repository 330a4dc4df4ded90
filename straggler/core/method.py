"""The contract every straggler predictor meets, NURD and baselines alike.

A method sees one checkpoint of one job (`CheckpointData`), never a running task's latency; parameters
are stored as given in ``__init__`` and learned state ends with ``_`` (as in scikit-learn). The job
driver (`OnlineJob`) decides when to ``fit`` and ``calibrate`` and floors predictions at the elapsed
time. Learned state round-trips as plain data (`get_state` / ``set_state``), so reading a stored model
never runs code. Details: docs/architecture.md, "Methods and the job driver".
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.state import State, StateCodec, dump_attributes, load_attributes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from straggler.core.jobtrace import JobTrace


@dataclass(frozen=True)
class CheckpointData:
    """What a job shows at one checkpoint: the only input a method may learn from."""

    X_finished: FloatArray
    """(n_finished, d) features of finished tasks, as of their finish time."""
    latency_finished: FloatArray
    """(n_finished,) their latencies, seconds."""
    X_running: FloatArray
    """(n_running, d) latest features of the running tasks still under evaluation."""
    elapsed_running: FloatArray
    """(n_running,) how long each has run so far, seconds (a lower bound on its latency)."""
    threshold: float
    """Straggler threshold in force (oracle p90 or an online estimate), seconds."""
    expected_tasks: int
    """Task count announced at job start."""
    at: float | None = None
    """The checkpoint's time (None when a caller has no clock, e.g. a unit test of one fit)."""
    finish_time: FloatArray | None = None
    """(n_finished,) when each finished task finished: lets a method rewind to an earlier checkpoint."""
    start_running: FloatArray | None = None
    """(n_running,) when each running task started."""
    running_ids: tuple[str, ...] | None = None
    """Ids of the running tasks (lets a method follow a task across checkpoints)."""
    finished_ids: tuple[str, ...] | None = None
    """Ids of the finished tasks."""
    flagged_ids: tuple[str, ...] = ()
    """Ids of the running tasks flagged earlier (no longer under evaluation, so not in X_running)."""
    flagged_start: FloatArray | None = None
    """When each of ``flagged_ids`` started."""

    @property
    def n_finished(self) -> int:
        return len(self.latency_finished)

    @property
    def n_running(self) -> int:
        return len(self.elapsed_running)


@dataclass(frozen=True)
class Scores:
    """A method's verdict on the running tasks of a checkpoint.

    Latency methods fill ``latency`` (their raw prediction) and ``adjusted`` (what is compared with the
    threshold); classifiers and detectors leave both NaN and set ``is_straggler`` directly.
    ``propensity`` and ``weight`` are NURD's z and w (NaN for methods without them); ``probability``
    is P(latency >= threshold) where a method estimates it (NaN otherwise), what a mitigation policy
    prices a copy with. A latency method may flag a task whose adjusted latency is under the
    threshold (``is_straggler``), when its probability says so.
    """

    is_straggler: BoolArray
    latency: FloatArray
    adjusted: FloatArray
    propensity: FloatArray
    weight: FloatArray
    probability: FloatArray

    @classmethod
    def from_latency(
        cls,
        latency: FloatArray,
        adjusted: FloatArray,
        threshold: float,
        propensity: FloatArray | None = None,
        weight: FloatArray | None = None,
        probability: FloatArray | None = None,
        flag: BoolArray | None = None,
    ) -> Scores:
        """``flag``: tasks flagged besides those whose adjusted latency reaches the threshold."""
        n = len(latency)
        nan = np.full(n, np.nan)
        is_straggler = np.asarray(adjusted >= threshold, dtype=bool)
        if flag is not None:
            is_straggler = is_straggler | np.asarray(flag, dtype=bool)
        return cls(
            is_straggler=is_straggler,
            latency=np.asarray(latency, dtype=np.float64),
            adjusted=np.asarray(adjusted, dtype=np.float64),
            propensity=nan if propensity is None else np.asarray(propensity, dtype=np.float64),
            weight=nan if weight is None else np.asarray(weight, dtype=np.float64),
            probability=nan if probability is None else np.asarray(probability, dtype=np.float64),
        )

    @classmethod
    def from_labels(
        cls, is_straggler: BoolArray, score: FloatArray | None = None, probability: FloatArray | None = None
    ) -> Scores:
        n = len(is_straggler)
        nan = np.full(n, np.nan)
        return cls(
            is_straggler=np.asarray(is_straggler, dtype=bool),
            latency=nan,
            adjusted=nan,
            propensity=nan if score is None else np.asarray(score, dtype=np.float64),
            weight=nan,
            probability=nan if probability is None else np.asarray(probability, dtype=np.float64),
        )


class StragglerMethod(ABC):
    """Base class: scikit-learn conventions, one job's checkpoints at a time."""

    #: name in the method registry and in reports
    name: ClassVar[str] = ""
    #: True for methods that predict a latency (the driver floors it at elapsed time)
    predicts_latency: ClassVar[bool] = True
    #: True for methods the paper grants true labels of a 2/3 sample of the job (Wrangler)
    needs_granted_labels: ClassVar[bool] = False
    #: True for methods trained on other, complete jobs before they see this one (START, ADMM);
    #: the evaluator cross-fits them by job, the worker loads them from ``straggler train``'s file
    learns_across_jobs: ClassVar[bool] = False
    #: True only for the oracle-fed control (`straggler.core.oracle`): told the future, evaluation only
    uses_future_information: ClassVar[bool] = False
    #: True for a method that can judge a job's tasks before any of them finished (the oracle-fed
    #: control): the job driver asks it from the job's first checkpoint, not once it is `ready`
    predicts_before_finishes: ClassVar[bool] = False
    #: learned attributes that are not plain state values, and how each becomes one
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {}

    def calibrate(self, data: CheckpointData) -> None:  # noqa: B027 - optional hook
        """Called once per job, at its first prediction checkpoint, before the first ``fit``."""

    def grant_labels(self, X: FloatArray, is_straggler: BoolArray) -> None:
        """Receive true labels of a sample of the job (only for ``needs_granted_labels`` methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not take granted labels")

    def fit_population(self, jobs: Sequence[JobTrace]) -> Self:
        """Learn from complete jobs of a training window, never the job being predicted.

        Only for ``learns_across_jobs`` methods. The fitted object is then copied, one copy per job,
        and driven by ``fit``/``predict`` like any other method.
        """
        raise NotImplementedError(f"{type(self).__name__} does not learn across jobs")

    @abstractmethod
    def fit(self, data: CheckpointData) -> Self:
        """Learn from a checkpoint (finished tasks, and running tasks' features but never their labels)."""

    @abstractmethod
    def predict(self, data: CheckpointData) -> Scores:
        """Score ``data``'s running tasks with the state learned by the last ``fit``."""

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters as given (scikit-learn convention), for reports and cloning."""
        return {n: getattr(self, n) for n in _parameter_names(type(self))}

    def get_state(self) -> State:
        """Everything learned so far as plain data (`straggler.core.state`): the learned attributes,
        those named in ``state_codecs`` converted. `set_state` on a fresh method with the same
        parameters gives back a method that decides exactly as this one."""
        return dump_attributes(self, self.state_codecs)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Take back what `get_state` returned (on a fresh method with the same parameters); raises
        ValueError, TypeError or KeyError on state that is not shaped as this method's."""
        load_attributes(self, state, self.state_codecs)


@functools.cache
def _parameter_names(cls: type[StragglerMethod]) -> tuple[str, ...]:
    """The names of ``cls.__init__``'s parameters but ``self`` (read once per class: `get_params`
    runs at every fit)."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")
