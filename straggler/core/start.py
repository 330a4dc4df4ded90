"""START (Tuli et al., IEEE TSC 2021) as a cross-job `StragglerMethod`.

An encoder and an LSTM, trained offline on complete jobs (`StartMethod.fit_population`), predict a
job's Pareto ``(alpha, beta)`` from per-checkpoint summaries (`summarise_checkpoint`); once only the
expected straggler count ``floor(E_S)`` of its tasks are unfinished, the running ones are flagged.
Torch is needed only to train: inference is numpy (`numpy_step`), so workers need not import it.

The paper's model and this project's adaptations: `git show 96386f7:docs/results.md`, §6; where it
sits among the methods: docs/architecture.md, "Baselines and START".
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from straggler.core.arrays import FloatArray
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.online import OnlineJob
from straggler.core.recorded_run import recorded_decisions

if TYPE_CHECKING:
    from straggler.core.jobtrace import JobTrace

K_FACTOR = 1.5
"""The paper's straggler parameter k: a straggler takes more than k times the mean latency."""
ALPHA_MAX = 50.0
"""Fitted tail indices are clipped here (a job of near-equal latencies has alpha -> infinity)."""
TIME_FLOOR = 1e-3
"""Latencies are floored here (seconds) before logs: a 0 s task would make beta = 0."""
QUANTILES = (0.1, 0.5, 0.9)
N_SCALARS = 13
"""Job-level entries of a checkpoint summary (see `summarise_checkpoint`)."""

INSTALL_HINT = "START needs PyTorch to train: pip install 'straggler-stream[start]'"


# --------------------------------------------------------------------------------------------------
# Pareto model (paper §3.1)
# --------------------------------------------------------------------------------------------------


def fit_pareto(latency: FloatArray) -> tuple[float, float]:
    """Maximum-likelihood Pareto fit: ``(alpha, beta)`` with ``beta = min(x)`` and
    ``alpha = q / sum(log(x / beta))`` (Eq. 3). Non-finite latencies are ignored; ``alpha`` is inf
    when all latencies are equal; raises ValueError with no finite latency."""
    x = np.asarray(latency, dtype=np.float64)
    x = np.maximum(x[np.isfinite(x)], TIME_FLOOR)
    if len(x) == 0:
        raise ValueError("fit_pareto needs at least one finite latency")
    beta = float(x.min())
    total = float(np.sum(np.log(x / beta)))
    alpha = math.inf if total <= 0.0 else len(x) / total
    return alpha, beta


def straggler_threshold(alpha: float, beta: float, k: float = K_FACTOR) -> float:
    """``K = k * alpha * beta / (alpha - 1)``: k times the Pareto mean; inf when ``alpha <= 1``."""
    if not alpha > 1.0:
        return math.inf
    if math.isinf(alpha):
        return k * beta
    return k * alpha * beta / (alpha - 1.0)


def expected_stragglers(alpha: float, q: float, k: float = K_FACTOR) -> float:
    """``E_S = q * (K / beta) ** -alpha = q * (k * alpha / (alpha - 1)) ** -alpha`` (Eq. 4).

    Independent of beta. 0 when ``alpha <= 1`` (the limit as alpha -> 1+, where K -> infinity).
    """
    if not alpha > 1.0:
        return 0.0
    if math.isinf(alpha):
        return 0.0 if k > 1.0 else float(q)
    return float(q) * float(np.exp(-alpha * np.log(k * alpha / (alpha - 1.0))))


def actual_stragglers(latency: FloatArray, k: float = K_FACTOR) -> int:
    """The paper's stragglers of a complete job: tasks whose latency exceeds K of the job's own fit."""
    x = np.asarray(latency, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return 0
    alpha, beta = fit_pareto(x)
    return int(np.sum(np.maximum(x, TIME_FLOOR) > straggler_threshold(alpha, beta, k)))


# --------------------------------------------------------------------------------------------------
# Checkpoint summary: what the encoder reads
# --------------------------------------------------------------------------------------------------


def summary_size(n_features: int) -> int:
    """Length of `summarise_checkpoint`'s vector for tasks with ``n_features`` features."""
    return (2 + len(QUANTILES)) * n_features + n_features + N_SCALARS


def _signed_log(x: FloatArray) -> FloatArray:
    return np.sign(x) * np.log1p(np.abs(x))


def _column_stats(X: FloatArray) -> FloatArray:
    """Per column: mean, std and `QUANTILES` of the finite entries (0 for a column with none)."""
    n, d = X.shape
    out = np.zeros((2 + len(QUANTILES), d))
    if n == 0:
        return out.reshape(-1)
    Z = np.where(np.isfinite(X), _signed_log(np.where(np.isfinite(X), X, 0.0)), np.nan)
    for j in range(d):
        col = Z[:, j]
        col = col[np.isfinite(col)]
        if len(col):
            out[0, j] = col.mean()
            out[1, j] = col.std()
            out[2:, j] = np.quantile(col, QUANTILES)
    return out.reshape(-1)


def _column_means(X: FloatArray) -> FloatArray:
    n, d = X.shape
    out = np.zeros(d)
    if n == 0:
        return out
    Z = np.where(np.isfinite(X), _signed_log(np.where(np.isfinite(X), X, 0.0)), np.nan)
    for j in range(d):
        col = Z[:, j]
        col = col[np.isfinite(col)]
        if len(col):
            out[j] = col.mean()
    return out


def summarise_checkpoint(data: CheckpointData) -> FloatArray:
    """One checkpoint of a job as a fixed-length vector, from `CheckpointData` alone (so from the past
    of the checkpoint only: the threshold is left out, as the oracle threshold is the future).

    Layout (d = number of features; features pass through ``sign(x) log(1 + |x|)``, missing entries
    are skipped):

    - running tasks' features: per feature mean, std, 10/50/90 % quantiles (5d);
    - finished tasks' features (as of their finish): per feature mean (d);
    - job scalars (13): log(1 + expected tasks); share finished; share running; log(1 + latency) of
      the finished tasks: mean, std, min, median, p90, max; log of the Pareto alpha fitted to them
      (clipped to [1e-2, ALPHA_MAX], 0 with fewer than 2); log(1 + elapsed) of the running tasks: mean
      and max; log(1 + job age), the age being the longest latency or elapsed time seen so far.
    """
    q = max(int(data.expected_tasks), 1)
    X_run = np.asarray(data.X_running, dtype=np.float64)
    X_fin = np.asarray(data.X_finished, dtype=np.float64)
    d = X_run.shape[1] if X_run.ndim == 2 else X_fin.shape[1]
    X_run = X_run.reshape(-1, d)
    X_fin = X_fin.reshape(-1, d)
    latency = np.asarray(data.latency_finished, dtype=np.float64)
    latency = latency[np.isfinite(latency)]
    elapsed = np.asarray(data.elapsed_running, dtype=np.float64)
    elapsed = elapsed[np.isfinite(elapsed)]

    scalars = np.zeros(N_SCALARS)
    scalars[0] = math.log1p(q)
    scalars[1] = len(latency) / q
    scalars[2] = len(elapsed) / q
    if len(latency):
        log_latency = np.log1p(latency)
        scalars[3] = log_latency.mean()
        scalars[4] = log_latency.std()
        scalars[5] = log_latency.min()
        scalars[6] = np.quantile(log_latency, 0.5)
        scalars[7] = np.quantile(log_latency, 0.9)
        scalars[8] = log_latency.max()
    if len(latency) >= 2:
        alpha, _ = fit_pareto(latency)
        scalars[9] = math.log(min(max(alpha, 1e-2), ALPHA_MAX))
    if len(elapsed):
        scalars[10] = np.log1p(elapsed).mean()
        scalars[11] = np.log1p(elapsed).max()
    age = max(float(latency.max()) if len(latency) else 0.0, float(elapsed.max()) if len(elapsed) else 0.0)
    scalars[12] = math.log1p(age)
    return np.concatenate([_column_stats(X_run), _column_means(X_fin), scalars])


class _SummaryRecorder(StragglerMethod):
    """A stand-in method that flags nothing and records `summarise_checkpoint` at every prediction."""

    name: ClassVar[str] = "start-recorder"
    predicts_latency: ClassVar[bool] = False

    def __init__(self) -> None:
        """No parameters."""

    def fit(self, data: CheckpointData) -> Self:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        self.summaries_: list[FloatArray] = getattr(self, "summaries_", [])
        self.times_: list[float] = getattr(self, "times_", [])
        self.summaries_.append(summarise_checkpoint(data))
        self.times_.append(float("nan") if data.at is None else float(data.at))
        return Scores.from_labels(np.zeros(data.n_running, dtype=bool))


def training_sequence(
    trace: JobTrace,
    *,
    quantile: float = 0.9,
    start_fraction: float = 0.04,
    refit_growth: float = 0.25,
) -> tuple[FloatArray, FloatArray]:
    """``(times, summaries)``: the checkpoint summaries START sees for ``trace`` online.

    The trace runs through the evaluator's own driver (`straggler.core.recorded_run`, with the
    online threshold), so the summaries come from exactly the `CheckpointData` the job shows
    at each prediction checkpoint. The stand-in method flags nothing itself; the driver still hides
    tasks flagged by the reactive rule (elapsed >= threshold), as it does online. Once START flags a
    job's tasks itself, the online running set lacks them; those late checkpoints are the only place
    where online summaries can differ from these.
    """
    recorder = _SummaryRecorder()
    job = OnlineJob(
        trace.job_id,
        recorder,
        len(trace.feature_names),
        trace.expected_tasks,
        quantile=quantile,
        start_fraction=start_fraction,
        refit_growth=refit_growth,
    )
    for _ in recorded_decisions(job, trace):
        pass
    summaries = getattr(recorder, "summaries_", [])
    d = summary_size(len(trace.feature_names))
    times = np.array(getattr(recorder, "times_", []), dtype=np.float64)
    return times, np.array(summaries, dtype=np.float64).reshape(len(summaries), d)


@dataclass(frozen=True)
class TrainingSet:
    """What START learns from: complete jobs' online summaries, their targets, and the scaling."""

    sequences: list[FloatArray]
    """Per usable job, its checkpoint summaries (`training_sequence`), shape (T_j, summary size)."""
    target: FloatArray
    """Per job, ``(log alpha, log beta)`` of its Pareto fit (alpha clipped to ``[1, ALPHA_MAX]``)."""
    x_mean: FloatArray
    x_scale: FloatArray
    """Summaries are standardised with these (std 1 where a column is constant)."""
    log_beta_mean: float
    log_beta_scale: float
    """The head's second output is ``(log beta - log_beta_mean) / log_beta_scale``."""
    n_features: int


def training_set(jobs: Sequence[JobTrace]) -> TrainingSet:
    """The `TrainingSet` of complete ``jobs``; jobs with fewer than 2 scored latencies or no prediction
    checkpoint are left out. Raises ValueError when jobs disagree on their features or none is usable."""
    sequences: list[FloatArray] = []
    targets: list[tuple[float, float]] = []
    n_features: int | None = None
    for job in jobs:
        latency = job.latency[job.scored]
        if len(latency) < 2:
            continue
        if n_features is None:
            n_features = len(job.feature_names)
        elif len(job.feature_names) != n_features:
            raise ValueError(f"job {job.job_id} has {len(job.feature_names)} features, not {n_features}")
        _, seq = training_sequence(job)
        if len(seq) == 0:
            continue
        alpha, beta = fit_pareto(latency)
        sequences.append(seq)
        targets.append((math.log(min(max(alpha, 1.0), ALPHA_MAX)), math.log(beta)))
    if not sequences or n_features is None:
        raise ValueError("START needs at least one complete job with a prediction checkpoint to train on")
    steps = np.concatenate(sequences)
    target = np.array(targets)
    return TrainingSet(
        sequences=sequences,
        target=target,
        x_mean=steps.mean(axis=0),
        x_scale=np.where(steps.std(axis=0) > 1e-9, steps.std(axis=0), 1.0),
        log_beta_mean=float(target[:, 1].mean()),
        log_beta_scale=float(target[:, 1].std()) if target[:, 1].std() > 1e-9 else 1.0,
        n_features=n_features,
    )


# --------------------------------------------------------------------------------------------------
# The network: numpy forward pass (inference) and torch module (training)
# --------------------------------------------------------------------------------------------------


def _softplus(x: FloatArray) -> FloatArray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: FloatArray) -> FloatArray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def numpy_step(
    weights: dict[str, FloatArray], z: FloatArray, state: tuple[FloatArray, FloatArray]
) -> tuple[FloatArray, tuple[FloatArray, FloatArray]]:
    """One checkpoint through encoder, LSTM and head: ``(raw head output (2,), new (h, c))``.

    ``state`` is ``(h, c)`` of shape (layers, hidden); PyTorch's gate order (input, forget, cell, output).
    """
    x = z
    for i in range(3):
        x = _softplus(weights[f"encoder.{2 * i}.weight"] @ x + weights[f"encoder.{2 * i}.bias"])
    h_all, c_all = state
    h_new, c_new = np.empty_like(h_all), np.empty_like(c_all)
    for layer in range(h_all.shape[0]):
        gates = (
            weights[f"lstm.weight_ih_l{layer}"] @ x
            + weights[f"lstm.bias_ih_l{layer}"]
            + weights[f"lstm.weight_hh_l{layer}"] @ h_all[layer]
            + weights[f"lstm.bias_hh_l{layer}"]
        )
        gate_in, gate_forget, cell, gate_out = np.split(gates, 4)
        c = _sigmoid(gate_forget) * c_all[layer] + _sigmoid(gate_in) * np.tanh(cell)
        h = _sigmoid(gate_out) * np.tanh(c)
        h_new[layer], c_new[layer] = h, c
        x = h
    out = weights["head.weight"] @ x + weights["head.bias"]
    return out, (h_new, c_new)


def initial_weights(
    n_in: int, encoder: tuple[int, ...], hidden: int, layers: int, seed: int = 0
) -> dict[str, FloatArray]:
    """Weights of the encoder-LSTM under the names and shapes of its PyTorch ``state_dict``, drawn as
    PyTorch initialises ``nn.Linear`` and ``nn.LSTM`` (uniform on +-1/sqrt(fan in), +-1/sqrt(hidden)).

    Drawn with NumPy (not PyTorch's generator): they let START run untrained without torch.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, FloatArray] = {}

    def uniform(bound: float, *shape: int) -> FloatArray:
        return rng.uniform(-bound, bound, size=shape)

    sizes = (n_in, *encoder)
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        weights[f"encoder.{2 * i}.weight"] = uniform(1.0 / math.sqrt(a), b, a)
        weights[f"encoder.{2 * i}.bias"] = uniform(1.0 / math.sqrt(a), b)
    bound = 1.0 / math.sqrt(hidden)
    for layer in range(layers):
        width = encoder[-1] if layer == 0 else hidden
        weights[f"lstm.weight_ih_l{layer}"] = uniform(bound, 4 * hidden, width)
        weights[f"lstm.weight_hh_l{layer}"] = uniform(bound, 4 * hidden, hidden)
        weights[f"lstm.bias_ih_l{layer}"] = uniform(bound, 4 * hidden)
        weights[f"lstm.bias_hh_l{layer}"] = uniform(bound, 4 * hidden)
    weights["head.weight"] = uniform(bound, 2, hidden)
    weights["head.bias"] = uniform(bound, 2)
    return weights


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(INSTALL_HINT) from error
    return torch


def _build_network(torch: Any, n_in: int, encoder: tuple[int, ...], hidden: int, layers: int) -> Any:
    nn = torch.nn

    class EncoderLSTM(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            sizes = (n_in, *encoder)
            blocks: list[Any] = []
            for a, b in itertools.pairwise(sizes):
                blocks += [nn.Linear(a, b), nn.Softplus()]
            self.encoder = nn.Sequential(*blocks)
            self.lstm = nn.LSTM(encoder[-1], hidden, num_layers=layers, batch_first=True)
            self.head = nn.Linear(hidden, 2)

        def forward(self, flat: Any, lengths: Any) -> Any:
            """``flat``: every step of every sequence, concatenated; returns padded (B, T, 2)."""
            encoded = self.encoder(flat)
            pieces = torch.split(encoded, lengths.tolist())
            padded = nn.utils.rnn.pad_sequence(pieces, batch_first=True)
            packed = nn.utils.rnn.pack_padded_sequence(
                padded, lengths, batch_first=True, enforce_sorted=False
            )
            out, _ = self.lstm(packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=padded.shape[1])
            return self.head(out)

    return EncoderLSTM()


# --------------------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------------------


class StartMethod(StragglerMethod):
    """START: an encoder-LSTM predicts the job's Pareto ``(alpha, beta)`` from its checkpoints so far;
    once no more than ``floor(E_S)`` of the job's tasks are unfinished, its running tasks are flagged.

    ``fit_population`` trains on complete jobs; ``predict`` advances the job's LSTM state by one
    checkpoint (idempotent per ``data.at``: a second call at the same time replaces that step);
    ``fit`` learns nothing per job (START's model is trained across jobs only).
    """

    name: ClassVar[str] = "start"
    predicts_latency: ClassVar[bool] = False
    learns_across_jobs: ClassVar[bool] = True
    state_before_: tuple[FloatArray, FloatArray]
    """The job's LSTM state before its latest checkpoint (set by ``predict``)."""

    def __init__(
        self,
        k: float = K_FACTOR,
        encoder: tuple[int, ...] = (128, 128, 32),
        hidden: int = 32,
        layers: int = 2,
        epochs: int = 300,
        learning_rate: float = 3e-3,
        weight_decay: float = 1e-5,
        validation: float = 0.15,
        patience: int = 40,
        random_state: int = 0,
    ) -> None:
        self.k = k
        self.encoder = encoder
        self.hidden = hidden
        self.layers = layers
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.validation = validation
        self.patience = patience
        self.random_state = random_state

    # -- training across jobs -------------------------------------------------------------------
    def init_population(self, jobs: Sequence[JobTrace]) -> Self:
        """Set START up on complete jobs without training and without torch: the input and target
        scaling `fit_population` would use, and the network at `initial_weights` (seeded by
        ``random_state``). Predictions are then an untrained network's, through the same NumPy
        inference as a trained START's: for tests and tools that must run without the extra."""
        data = training_set(jobs)
        n_in = data.sequences[0].shape[1]
        weights = initial_weights(n_in, tuple(self.encoder), self.hidden, self.layers, self.random_state)
        return self._set_model(data, weights, best_epoch=-1, history=[], seconds=0.0)

    def _set_model(
        self,
        data: TrainingSet,
        weights: dict[str, FloatArray],
        *,
        best_epoch: int,
        history: list[tuple[float, float]],
        seconds: float,
    ) -> Self:
        """Store the network's weights and the scaling of ``data``: what `predict` reads."""
        self.weights_ = weights
        self.x_mean_ = data.x_mean
        self.x_scale_ = data.x_scale
        self.log_beta_mean_ = data.log_beta_mean
        self.log_beta_scale_ = data.log_beta_scale
        self.n_features_ = data.n_features
        self.training_jobs_ = len(data.sequences)
        self.best_epoch_ = best_epoch
        self.history_ = history
        self.train_seconds_ = seconds
        return self

    def fit_population(self, jobs: Sequence[JobTrace]) -> Self:
        """Train the encoder-LSTM on complete jobs: each job's online summaries, target its Pareto fit."""
        torch = _import_torch()
        started = time.perf_counter()
        data = training_set(jobs)
        sequences, x_mean, x_scale = data.sequences, data.x_mean, data.x_scale
        target = data.target
        target_scaled = np.column_stack(
            [target[:, 0], (target[:, 1] - data.log_beta_mean) / data.log_beta_scale]
        )

        rng = np.random.default_rng(self.random_state)
        order = rng.permutation(len(sequences))
        n_valid = round(self.validation * len(sequences)) if len(sequences) >= 8 else 0
        valid, train = order[:n_valid], order[n_valid:]

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch.manual_seed(self.random_state)
            net = _build_network(torch, x_mean.shape[0], tuple(self.encoder), self.hidden, self.layers)
            net = net.double()

            def batch(index: Any) -> tuple[Any, Any, Any, Any]:
                seqs = [np.clip((sequences[i] - x_mean) / x_scale, -10.0, 10.0) for i in index]
                lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
                flat = torch.from_numpy(np.concatenate(seqs))
                mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
                y = torch.from_numpy(target_scaled[index])
                return flat, lengths, mask, y

            def loss_of(net: Any, data: tuple[Any, Any, Any, Any]) -> Any:
                flat, lengths, mask, y = data
                out = net(flat, lengths)
                log_alpha = torch.log1p(torch.nn.functional.softplus(out[..., 0]))
                err = (log_alpha - y[:, None, 0]) ** 2 + (out[..., 1] - y[:, None, 1]) ** 2
                per_job = (err * mask).sum(dim=1) / lengths
                return per_job.mean()

            train_data = batch(train)
            valid_data = batch(valid) if len(valid) else None
            optimiser = torch.optim.Adam(
                net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay
            )
            best = (math.inf, 0, {k: v.detach().clone() for k, v in net.state_dict().items()})
            history: list[tuple[float, float]] = []
            for epoch in range(self.epochs):
                net.train()
                optimiser.zero_grad()
                loss = loss_of(net, train_data)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
                optimiser.step()
                with torch.no_grad():
                    score = float(loss_of(net, valid_data)) if valid_data is not None else float(loss)
                history.append((float(loss.detach()), score))
                if score < best[0]:
                    best = (score, epoch, {k: v.detach().clone() for k, v in net.state_dict().items()})
                elif epoch - best[1] >= self.patience:
                    break
            net.load_state_dict(best[2])
        finally:
            torch.set_num_threads(threads)

        weights = {k: v.detach().numpy().astype(np.float64).copy() for k, v in net.state_dict().items()}
        return self._set_model(
            data, weights, best_epoch=best[1], history=history, seconds=time.perf_counter() - started
        )

    # -- one job, checkpoint by checkpoint ------------------------------------------------------
    def _check_fitted(self, data: CheckpointData) -> None:
        if not hasattr(self, "weights_"):
            raise RuntimeError(
                "START learns across jobs: call fit_population (or load a trained model) first"
            )
        d = data.X_running.shape[1] if data.X_running.ndim == 2 else data.X_finished.shape[1]
        if d != self.n_features_:
            raise ValueError(f"START was trained on {self.n_features_} features; this job has {d}")

    def parameters_from_summaries(self, summaries: FloatArray) -> FloatArray:
        """``(T, 2)`` predicted ``(alpha, beta)`` after each of a job's checkpoint summaries."""
        state = self._initial_state()
        out = np.empty((len(summaries), 2))
        for t, z in enumerate(summaries):
            raw, state = numpy_step(self.weights_, self._scale(z), state)
            out[t] = self._parameters(raw)
        return out

    def _initial_state(self) -> tuple[FloatArray, FloatArray]:
        return np.zeros((self.layers, self.hidden)), np.zeros((self.layers, self.hidden))

    def _scale(self, z: FloatArray) -> FloatArray:
        return np.clip((z - self.x_mean_) / self.x_scale_, -10.0, 10.0)

    def _parameters(self, raw: FloatArray) -> tuple[float, float]:
        alpha = 1.0 + float(_softplus(raw[0]))
        beta = math.exp(self.log_beta_mean_ + self.log_beta_scale_ * float(raw[1]))
        return alpha, beta

    def fit(self, data: CheckpointData) -> Self:
        """Nothing to learn within a job: the model was trained across jobs."""
        self._check_fitted(data)
        self.fallback_ = data.n_finished < 2
        return self

    def predict(self, data: CheckpointData) -> Scores:
        self._check_fitted(data)
        z = self._scale(summarise_checkpoint(data))
        previous_at = getattr(self, "at_", None)
        state: tuple[FloatArray, FloatArray]
        if data.at is not None and previous_at is not None and data.at == previous_at:
            state = self.state_before_  # the same checkpoint again: replace that step
        else:
            state = getattr(self, "state_", None) or self._initial_state()
            self.steps_: int = getattr(self, "steps_", 0) + 1
        self.state_before_ = state
        raw, self.state_ = numpy_step(self.weights_, z, state)
        self.at_ = data.at
        self.alpha_, self.beta_ = self._parameters(raw)
        self.expected_stragglers_ = expected_stragglers(self.alpha_, data.expected_tasks, self.k)

        elapsed = np.asarray(data.elapsed_running, dtype=np.float64)
        reactive = np.asarray(elapsed >= data.threshold, dtype=bool)
        self.fallback_ = data.n_finished < 2
        if self.fallback_:
            return Scores.from_labels(reactive)
        count = math.floor(self.expected_stragglers_)
        unfinished = data.expected_tasks - data.n_finished
        tail = count >= 1 and unfinished <= count
        flags = reactive | tail
        return Scores.from_labels(flags, np.full(data.n_running, self.expected_stragglers_))
