"""Collaborative straggler prediction by consensus ADMM (the ADMM collaborative-learning paper, §3.2).

One L2-regularised logistic classifier is shared by N nodes (the agent's partitions): each node solves
a local step on its own finished tasks and sends only x_i + u_i; `Consensus` replays the consensus step
and the stopping rule from the messages alone, so the in-process driver (`fit_consensus`) and the Kafka
exchange compute bit-identical weights. numpy/scipy only, no Kafka.

The equations and the stopping rule: docs/architecture.md, "Collaborative ADMM".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

import numpy as np
from scipy import special

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.partitioner import partition_of
from straggler.core.preprocessing import Standardiser
from straggler.core.state import STANDARDISER, StateCodec

if TYPE_CHECKING:
    from straggler.core.jobtrace import JobTrace

#: A finished task is a straggler when its latency exceeds this multiple of its job's median
#: (the paper's beta, "1.3 as a rule of thumb", after Yadwadkar et al.).
STRAGGLER_FACTOR = 1.3
#: The pipeline's partition count (``straggler.kafka.topics.DEFAULT_PARTITIONS``; not imported, to
#: keep the core free of Kafka). A test checks they agree.
DEFAULT_NODES = 8
FLOAT_BYTES = 8


# --------------------------------------------------------------------------------------------------
# Node data: finished tasks only
# --------------------------------------------------------------------------------------------------


def straggler_labels(latency: FloatArray, factor: float = STRAGGLER_FACTOR) -> BoolArray:
    """``latency > factor * median(latency)``: one job's finished tasks (all latencies finite)."""
    latency = np.asarray(latency, dtype=np.float64)
    if len(latency) == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(latency > factor * float(np.median(latency)), dtype=bool)


def job_training_rows(trace: JobTrace, factor: float = STRAGGLER_FACTOR) -> tuple[FloatArray, BoolArray]:
    """A complete job's labelled rows: its finished (scored) tasks, their features as of their finish
    time, labelled against the median of the job's finished tasks. Killed, failed or cut tasks have
    no latency and give neither a row nor a share of the median."""
    scored = trace.scored
    X = np.asarray(trace.finish_features[scored], dtype=np.float64)
    return X, straggler_labels(trace.latency[scored], factor)


@dataclass(frozen=True)
class NodeData:
    """One node's training set: features (raw or standardised) and straggler labels."""

    X: FloatArray
    y: BoolArray

    @property
    def n(self) -> int:
        return len(self.y)


def partition_datasets(
    jobs: Sequence[JobTrace], n_nodes: int = DEFAULT_NODES, factor: float = STRAGGLER_FACTOR
) -> list[NodeData]:
    """Each partition's finished tasks, jobs in the given order (so the result is deterministic)."""
    if not jobs:
        raise ValueError("no training job")
    d = len(jobs[0].feature_names)
    parts: list[list[tuple[FloatArray, BoolArray]]] = [[] for _ in range(n_nodes)]
    for trace in jobs:
        if len(trace.feature_names) != d:
            raise ValueError(f"job {trace.job_id} has {len(trace.feature_names)} features, expected {d}")
        parts[partition_of(trace.job_id, n_nodes)].append(job_training_rows(trace, factor))
    out = []
    for rows in parts:
        X = np.concatenate([r[0] for r in rows]) if rows else np.zeros((0, d))
        y = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, dtype=bool)
        out.append(NodeData(X, y))
    return out


def node_moments(X: FloatArray) -> FloatArray:
    """What a node shares for the global scaler: rows, and per column finite count, sum, sum of squares."""
    X = np.asarray(X, dtype=np.float64)
    finite = np.isfinite(X)
    Z = np.where(finite, X, 0.0)
    return np.concatenate([[len(X)], finite.sum(axis=0), Z.sum(axis=0), (Z * Z).sum(axis=0)])


def standardiser_from_moments(moments: Sequence[FloatArray]) -> Standardiser:
    """The `Standardiser` of the pooled data, from the nodes' `node_moments` alone.

    Same rule as ``Standardiser.learn`` on the pooled rows: fill = mean of finite entries, then centre
    and scale of the filled columns (a filled column's mean is the fill value; its variance drops the
    filled entries' zero deviations)."""
    total = np.sum(np.stack(moments), axis=0)
    d = (len(total) - 1) // 3
    n, count, s, ss = total[0], total[1 : 1 + d], total[1 + d : 1 + 2 * d], total[1 + 2 * d :]
    fill = np.divide(s, count, out=np.zeros(d), where=count > 0)
    if n == 0:
        return Standardiser(fill=fill, center=np.zeros(d), scale=np.ones(d), varying=np.zeros(d, dtype=bool))
    center = fill
    variance = np.maximum(ss / n - 2.0 * fill * s / n + count * fill * fill / n, 0.0)
    spread = np.sqrt(variance)
    varying = np.asarray(spread > 1e-12 * np.maximum(1.0, np.abs(center)), dtype=bool)
    return Standardiser(fill=fill, center=center, scale=np.where(varying, spread, 1.0), varying=varying)


# --------------------------------------------------------------------------------------------------
# Consensus ADMM
# --------------------------------------------------------------------------------------------------


def _with_intercept(X: FloatArray) -> FloatArray:
    return np.hstack([np.asarray(X, dtype=np.float64), np.ones((len(X), 1))])


def logistic_objective(
    A: FloatArray, b: FloatArray, w: FloatArray, penalty: FloatArray
) -> tuple[float, FloatArray, FloatArray]:
    """Mean logistic loss of ``w`` on rows ``A`` (intercept column included), labels ``b`` in {-1, +1},
    plus 1/2 sum(penalty * w^2); with its gradient and Hessian."""
    value = 0.5 * float(np.sum(penalty * w * w))
    grad = penalty * w
    hess = np.diag(penalty)
    m = len(b)
    if m:
        t = b * (A @ w)
        value += float(np.mean(np.logaddexp(0.0, -t)))
        s = special.expit(-t)  # = 1 - sigma(t)
        grad = grad - (A.T @ (b * s)) / m
        hess = hess + (A.T * (s * (1.0 - s))) @ A / m
    return value, grad, hess


def damped_newton(
    objective: Callable[[FloatArray], tuple[float, FloatArray, FloatArray]],
    w0: FloatArray,
    *,
    tol: float = 1e-10,
    decrement_tol: float = 1e-14,
    max_iter: int = 100,
) -> FloatArray:
    """Minimise a smooth strictly convex ``objective`` (value, gradient, Hessian) by Newton steps with
    Armijo backtracking. Stops when the largest gradient entry is at most ``tol``, when the Newton
    decrement g'H^-1 g is at most ``decrement_tol`` (after that full step; the distance to the
    optimum in the Hessian's norm is then about its square root), or when the line search cannot
    find a decrease above the objective's rounding error. Deterministic."""
    w = np.array(w0, dtype=np.float64, copy=True)
    value, grad, hess = objective(w)
    for _ in range(max_iter):
        if float(np.max(np.abs(grad))) <= tol:
            break
        step = np.linalg.solve(hess, grad)
        decrement = float(grad @ step)
        if decrement <= decrement_tol:
            return np.asarray(w - step)
        t = 1.0
        while True:
            candidate = w - t * step
            new_value, new_grad, new_hess = objective(candidate)
            if new_value <= value - 1e-4 * t * decrement:
                break
            t *= 0.5
            if t < 1e-6:
                return w  # the objective's rounding error swamps what decrease is left
        w, value, grad, hess = candidate, new_value, new_grad, new_hess
    return w


class ConsensusNode:
    """One node of consensus ADMM: its data never leaves; each round it publishes x_i + u_i only."""

    def __init__(self, data: NodeData, n_nodes: int, *, rho: float = 1.0, lam: float = 1.0) -> None:
        self.A = _with_intercept(data.X)
        self.b = np.where(np.asarray(data.y, dtype=bool), 1.0, -1.0)
        self.n_nodes = n_nodes
        self.rho = rho
        self.lam = lam
        dim = self.A.shape[1]
        self.x = np.zeros(dim)
        self.u = np.zeros(dim)
        self.message = np.zeros(dim)
        # lambda/N R(x) over the feature weights, rho/2 ||x - v||^2 over all: the Newton penalty
        self._reg = np.r_[np.full(dim - 1, lam / n_nodes), 0.0]

    @property
    def dim(self) -> int:
        return len(self.x)

    def local_step(self, z: FloatArray) -> FloatArray:
        """x-update against the consensus ``z``; returns the message x_i + u_i (all that travels)."""
        self.x = self._prox_logistic(z - self.u)
        self.message = self.x + self.u
        return self.message

    def dual_step(self, z: FloatArray) -> None:
        """u_i <- u_i + x_i - z, written as message - z (exactly what every replica computes)."""
        self.u = self.message - z

    def _prox_logistic(self, v: FloatArray) -> FloatArray:
        """argmin_x mean logistic loss + 1/2 x' diag(reg) x + rho/2 ||x - v||^2, warm-started at x."""
        A, b, rho = self.A, self.b, self.rho
        penalty = self._reg + rho
        offset = 0.5 * rho * float(v @ v)

        def objective(w: FloatArray) -> tuple[float, FloatArray, FloatArray]:
            # 1/2 (reg + rho) w^2 - rho w.v + rho/2 v^2 == 1/2 reg w^2 + rho/2 ||w - v||^2
            value, grad, hess = logistic_objective(A, b, w, penalty)
            return value - rho * float(w @ v) + offset, grad - rho * v, hess

        return damped_newton(objective, self.x)


@dataclass(frozen=True)
class RoundRecord:
    """One round's consensus residuals (Boyd et al. §3.3) and whether they met the tolerances."""

    round: int
    primal: float
    dual: float
    eps_primal: float
    eps_dual: float

    @property
    def converged(self) -> bool:
        return bool(self.primal <= self.eps_primal and self.dual <= self.eps_dual)


class Consensus:
    """The consensus step and stopping rule, replicated on every node (or run once, in-process).

    It sees only the nodes' messages m_i = x_i + u_i, in node order. From them it derives
    z = mean(m_i) (the paper's w-update), every dual u_i = m_i - z and every x_i = m_i - u_i(previous),
    hence the residuals: every replica fed the same messages reaches the same verdict.
    """

    def __init__(
        self, n_nodes: int, dim: int, *, rho: float = 1.0, eps_abs: float = 1e-4, eps_rel: float = 1e-3
    ) -> None:
        self.n_nodes = n_nodes
        self.rho = rho
        self.eps_abs = eps_abs
        self.eps_rel = eps_rel
        self.z = np.zeros(dim)
        self.u = np.zeros((n_nodes, dim))
        self.history: list[RoundRecord] = []

    def update(self, messages: Sequence[FloatArray]) -> RoundRecord:
        if len(messages) != self.n_nodes:
            raise ValueError(f"expected {self.n_nodes} messages, got {len(messages)}")
        M = np.stack([np.asarray(m, dtype=np.float64) for m in messages])
        x = M - self.u
        z_prev = self.z
        z = M.mean(axis=0)
        u = M - z
        n, p = M.shape
        primal = float(np.sqrt(np.sum((x - z) ** 2)))
        dual = float(self.rho * np.sqrt(n) * np.linalg.norm(z - z_prev))
        root = np.sqrt(n * p)
        eps_primal = float(root) * self.eps_abs + self.eps_rel * max(
            float(np.sqrt(np.sum(x * x))), float(np.sqrt(n) * np.linalg.norm(z))
        )
        eps_dual = float(root) * self.eps_abs + self.eps_rel * self.rho * float(np.sqrt(np.sum(u * u)))
        self.z, self.u = z, u
        record = RoundRecord(len(self.history), primal, dual, eps_primal, eps_dual)
        self.history.append(record)
        return record


@dataclass
class ConsensusHistory:
    """What a consensus run did: per-round residuals and what travelled, against shipping the data."""

    n_nodes: int
    dim: int
    node_rows: list[int]
    rounds: list[RoundRecord] = field(default_factory=list)
    transport: str = "in-process"
    messages_per_round: list[int] = field(default_factory=list)
    """Kafka runs: how many exchange records node 0 read per round (every node's, its own included)."""

    @property
    def converged(self) -> bool:
        return bool(self.rounds) and self.rounds[-1].converged

    @property
    def vector_bytes(self) -> int:
        """One message: the float64 vector x_i + u_i (feature weights and intercept)."""
        return self.dim * FLOAT_BYTES

    @property
    def bytes_up_per_round(self) -> int:
        """Node -> aggregator per round: every node's message."""
        return self.n_nodes * self.vector_bytes

    @property
    def bytes_star_per_round(self) -> int:
        """The paper's star topology per round: messages up, and z back down to every node."""
        return 2 * self.n_nodes * self.vector_bytes

    @property
    def bytes_all_to_all_per_round(self) -> int:
        """A single-partition exchange topic: messages up once, and every node reads all N."""
        return self.n_nodes * self.vector_bytes + self.n_nodes * self.n_nodes * self.vector_bytes

    @property
    def scaler_bytes(self) -> int:
        """Once, before round 0: each node's moments for the global scaler (rows, 3 per feature)."""
        return self.n_nodes * (1 + 3 * (self.dim - 1)) * FLOAT_BYTES

    @property
    def data_bytes(self) -> int:
        """Shipping every node's rows to one place instead: float64 features and a one-byte label."""
        return sum(self.node_rows) * ((self.dim - 1) * FLOAT_BYTES + 1)

    def summary(self) -> dict[str, float | int | str | bool]:
        rounds = len(self.rounds)
        return {
            "transport": self.transport,
            "nodes": self.n_nodes,
            "rows": sum(self.node_rows),
            "weights": self.dim,
            "rounds": rounds,
            "converged": self.converged,
            "final_primal_residual": self.rounds[-1].primal if rounds else float("nan"),
            "final_dual_residual": self.rounds[-1].dual if rounds else float("nan"),
            "vector_bytes": self.vector_bytes,
            "bytes_up_per_round": self.bytes_up_per_round,
            "bytes_star_per_round": self.bytes_star_per_round,
            "bytes_all_to_all_per_round": self.bytes_all_to_all_per_round,
            "scaler_bytes": self.scaler_bytes,
            "bytes_star_total": self.scaler_bytes + rounds * self.bytes_star_per_round,
            "data_bytes": self.data_bytes,
        }


class ConsensusExchange(Protocol):
    """How consensus rounds run: in one process (`fit_consensus`) or over Kafka."""

    def __call__(
        self,
        node_datasets: Sequence[NodeData],
        rounds: int,
        *,
        rho: float = 1.0,
        lam: float = 1.0,
        eps_abs: float = 1e-4,
        eps_rel: float = 1e-3,
    ) -> tuple[FloatArray, ConsensusHistory]: ...


def fit_consensus(
    node_datasets: Sequence[NodeData],
    rounds: int = 200,
    *,
    rho: float = 1.0,
    lam: float = 1.0,
    eps_abs: float = 1e-4,
    eps_rel: float = 1e-3,
) -> tuple[FloatArray, ConsensusHistory]:
    """Consensus ADMM with every node in this process: weights (features..., intercept) and history.

    Runs at most ``rounds`` rounds, stopping early when both residuals meet their tolerances
    (``eps_abs=0`` and ``eps_rel=0`` run the full budget)."""
    nodes = [ConsensusNode(data, len(node_datasets), rho=rho, lam=lam) for data in node_datasets]
    dim = nodes[0].dim
    state = Consensus(len(nodes), dim, rho=rho, eps_abs=eps_abs, eps_rel=eps_rel)
    for _ in range(rounds):
        messages = [node.local_step(state.z) for node in nodes]
        record = state.update(messages)
        for node in nodes:
            node.dual_step(state.z)
        if record.converged:
            break
    history = ConsensusHistory(len(nodes), dim, [d.n for d in node_datasets], list(state.history))
    return state.z.copy(), history


def centralised_logistic(node_datasets: Sequence[NodeData], lam: float = 1.0) -> FloatArray:
    """The problem ADMM solves, solved in one place (the data would have to travel for this):
    minimise sum_i mean_j loss_ij(w) + lambda/2 ||w_features||^2, i.e. each row weighted 1/m_i."""
    A = np.vstack([_with_intercept(d.X) for d in node_datasets])
    b = np.concatenate([np.where(d.y, 1.0, -1.0) for d in node_datasets])
    weights = np.concatenate([np.full(d.n, 1.0 / max(d.n, 1)) for d in node_datasets])
    dim = A.shape[1]
    penalty = np.r_[np.full(dim - 1, lam), 0.0]

    def objective(w: FloatArray) -> tuple[float, FloatArray, FloatArray]:
        t = b * (A @ w)
        s = special.expit(-t)
        value = float(weights @ np.logaddexp(0.0, -t)) + 0.5 * float(np.sum(penalty * w * w))
        grad = penalty * w - A.T @ (weights * b * s)
        hess = np.diag(penalty) + (A.T * (weights * s * (1.0 - s))) @ A
        return value, grad, hess

    return damped_newton(objective, np.zeros(dim), tol=1e-12)


# --------------------------------------------------------------------------------------------------
# The straggler method
# --------------------------------------------------------------------------------------------------


def _load_history(state: dict[str, Any]) -> ConsensusHistory:
    rounds = [RoundRecord(**r) for r in state.pop("rounds")]
    return ConsensusHistory(**state, rounds=rounds)


CONSENSUS_HISTORY = StateCodec(asdict, lambda s: _load_history(dict(s)))


class Admm(StragglerMethod):
    """Collaborative straggler prediction: one logistic classifier learned across jobs by consensus
    ADMM over the agent's partitions, each partition's finished tasks staying where they are.

    ``fit_population`` builds each partition's rows (finished tasks of the training jobs keyed to it,
    features as of finish time, label latency > 1.3 x the job's median), standardises them with the
    pooled statistics assembled from per-partition moments (training data only), and runs consensus
    ADMM (in-process, or over Kafka when given ``exchange``). ``fit`` learns nothing from the job being
    predicted. ``predict`` flags a running task when the classifier's straggler probability is at
    least ``decision_threshold`` (0.5: the paper's maximum-posterior rule); the job driver also flags
    any task that has already run for the threshold, as for every classifier.
    """

    name: ClassVar[str] = "admm"
    predicts_latency: ClassVar[bool] = False
    learns_across_jobs: ClassVar[bool] = True
    state_codecs: ClassVar[Mapping[str, StateCodec]] = {
        "scaler_": STANDARDISER,
        "history_": CONSENSUS_HISTORY,
    }

    def __init__(
        self,
        rho: float = 1.0,
        lam: float = 1.0,
        rounds: int = 200,
        n_partitions: int = DEFAULT_NODES,
        straggler_factor: float = STRAGGLER_FACTOR,
        decision_threshold: float = 0.5,
        eps_abs: float = 1e-4,
        eps_rel: float = 1e-3,
    ) -> None:
        self.rho = rho
        self.lam = lam
        self.rounds = rounds
        self.n_partitions = n_partitions
        self.straggler_factor = straggler_factor
        self.decision_threshold = decision_threshold
        self.eps_abs = eps_abs
        self.eps_rel = eps_rel

    def fit_population(self, jobs: Sequence[JobTrace], exchange: ConsensusExchange | None = None) -> Self:
        raw = partition_datasets(jobs, self.n_partitions, self.straggler_factor)
        self.scaler_ = standardiser_from_moments([node_moments(d.X) for d in raw])
        datasets = [NodeData(self.scaler_.transform(d.X), d.y) for d in raw]
        positives = sum(int(d.y.sum()) for d in datasets)
        total = sum(d.n for d in datasets)
        self.n_features_ = datasets[0].X.shape[1]
        self.constant_class_: bool | None = None
        if positives == 0 or positives == total:
            # one class (or no row) in the whole window: nothing to separate, predict that class
            self.constant_class_ = total > 0 and positives == total
            self.coef_ = np.zeros(self.n_features_)
            self.intercept_ = 0.0
            self.history_ = ConsensusHistory(len(datasets), self.n_features_ + 1, [d.n for d in datasets])
            return self
        run = exchange if exchange is not None else fit_consensus
        weights, self.history_ = run(
            datasets, self.rounds, rho=self.rho, lam=self.lam, eps_abs=self.eps_abs, eps_rel=self.eps_rel
        )
        self.coef_ = np.asarray(weights[:-1], dtype=np.float64)
        self.intercept_ = float(weights[-1])
        return self

    def fit(self, data: CheckpointData) -> Self:
        """Nothing to learn from the job being predicted: the model comes from ``fit_population``."""
        self.fallback_ = False
        return self

    def straggler_probability(self, X: FloatArray) -> FloatArray:
        if not hasattr(self, "scaler_"):
            raise RuntimeError("Admm.predict called before fit_population")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_:
            raise ValueError(f"expected {self.n_features_} features, got shape {X.shape}")
        return np.asarray(special.expit(self.scaler_.transform(X) @ self.coef_ + self.intercept_))

    def predict(self, data: CheckpointData) -> Scores:
        probability = self.straggler_probability(data.X_running)
        if self.constant_class_ is not None:
            return Scores.from_labels(np.full(data.n_running, self.constant_class_, dtype=bool))
        return Scores.from_labels(np.asarray(probability >= self.decision_threshold, dtype=bool), probability)
