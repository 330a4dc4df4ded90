"""Each job's `OnlineJob`, kept in Faust tables so a restarted or rebalanced worker gets it back.

Tables ``tasks`` (task changes, one row per checkpoint: `JobStore.hold`), ``jobs`` (one row per
job: a checkpoint's commit record) and ``models`` (each refit's method as data, `straggler.core.model_codec`,
never a pickle), all written on the job's own changelog partition; in-memory `OnlineJob`s are a
cache rebuilt from them.
A killed worker can leave any subset of a checkpoint's writes; the order in which the worker makes
them, and why it then recovers exactly, is `pipeline.commit_order.CommitOrder.checkpoint`.
A rebuild trusts the job row alone: the model version it names, its flags, no flag after its last
evaluated checkpoint. Details: docs/architecture.md, "The worker's tables and recovery".
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from schemas import nan_to_none, none_to_nan
from straggler.core.jobstate import TaskRecord, TaskStatus
from straggler.core.method import StragglerMethod
from straggler.core.model_codec import ModelRecordError, decode_model, encode_model
from straggler.core.online import Decision, OnlineJob

SEPARATOR = "\x1f"
Position = tuple[str, int, int]
"""An input record's topic, partition and offset."""
log = logging.getLogger(__name__)


SEQUENCE_DIGITS = 12
"""Task rows are keyed ``job \x1f`` + a zero-padded sequence, so key order is write order."""


def changes_key(job_id: str, sequence: int) -> bytes:
    return f"{job_id}{SEPARATOR}{sequence:0{SEQUENCE_DIGITS}d}".encode()


def model_key(job_id: str, version: int) -> bytes:
    return f"{job_id}{SEPARATOR}{version}".encode()


def task_row(record: TaskRecord, flagged_at: float | None) -> dict[str, Any]:
    """One task's state as a dict for `encode_changes` (the features as an array; NaN written as null).

    The keys are short because every task row of the changelog repeats them: ``s`` status, ``x``
    features, ``st`` start, ``t`` observed at, ``a`` attempt, ``l`` latency, ``f`` flagged at;
    `read_task_row` turns them back into a `TaskRecord` and its flag time."""
    return {
        "s": int(record.status),
        "x": record.features,
        "st": float(record.start),
        "t": float(record.observed_at),
        "a": int(record.attempt),
        "l": nan_to_none(record.latency),
        "f": None if flagged_at is None else float(flagged_at),
    }


def read_task_row(row: Mapping[str, Any]) -> tuple[TaskRecord, float | None]:
    features = np.array([none_to_nan(v) for v in row["x"]], dtype=np.float64)
    latency = none_to_nan(row["l"])
    record = TaskRecord(TaskStatus(row["s"]), features, row["st"], row["t"], row["a"], latency)
    return record, row["f"]


def encode_changes(rows: Mapping[str, Mapping[str, Any]]) -> bytes:
    """A task row of the ``tasks`` table: task id -> `task_row` (orjson writes NaN as null)."""
    return orjson.dumps(rows, option=orjson.OPT_SERIALIZE_NUMPY, default=_listed)


def _listed(value: Any) -> Any:
    """What orjson does not write itself: an array that is not C-contiguous."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} in a task row")


def decode_changes(payload: bytes) -> dict[str, tuple[TaskRecord, float | None]]:
    return {task_id: read_task_row(row) for task_id, row in orjson.loads(payload).items()}


@dataclass
class JobMeta:
    """The per-job row of the ``jobs`` table."""

    expected_tasks: int
    feature_names: list[str]
    live: bool = True
    """No checkpoint boundary seen yet: evaluated on the worker's timer."""
    model_version: int = 0
    fitted_on: int = 0
    calibrated: bool = False
    last_evaluated: float | None = None
    ended_at: float | None = None
    ticks: int = 0
    checkpoint_flags: dict[str, float] = field(default_factory=dict)
    """The flags raised at ``last_evaluated`` (task id -> flag time), until a task row carries them."""

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, payload: bytes) -> JobMeta:
        return cls(**orjson.loads(payload))


JobFactory = Callable[[str, JobMeta], OnlineJob]


@dataclass
class _CachedJob:
    meta: JobMeta
    job: OnlineJob
    next_sequence: int
    changed: set[str] = field(default_factory=set)
    """Tasks changed since the job's last task row: `write_changes` writes them as one row."""
    holding: list[Position] = field(default_factory=list)
    """The input records `JobStore.hold` was given since the job's last task row."""


@dataclass
class JobStore:
    """Write-through cache of `OnlineJob`s over the three tables."""

    tasks: MutableMapping[bytes, bytes]
    jobs: MutableMapping[bytes, bytes]
    models: MutableMapping[bytes, bytes]
    make_job: JobFactory
    _cache: dict[str, _CachedJob] = field(default_factory=dict)
    _unacknowledged: set[str] = field(default_factory=set)
    """Jobs whose job row was written and is not known to be on the broker yet."""
    _holders: dict[Position, str] = field(default_factory=dict)
    """Each input record whose changes are not written yet, with its job (`hold`)."""

    def forget_cache(self) -> None:
        """Partitions moved: what is cached may no longer be ours, or may be stale.

        Changes not written yet go with it: the records that made them are held (`hold`), never
        acknowledged, so the partition's next owner reads them again."""
        self._cache.clear()
        self._holders.clear()

    def reload(self, job_id: str) -> OnlineJob | None:
        """Write the job's pending changes, then rebuild it from the tables (its feature names changed)."""
        self.write_changes(job_id)
        self._cache.pop(job_id, None)
        return self.job(job_id)

    def meta(self, job_id: str) -> JobMeta | None:
        cached = self._cache.get(job_id)
        if cached is not None:
            return cached.meta
        payload = self.jobs.get(job_id.encode())
        return None if payload is None else JobMeta.decode(payload)

    def cached_jobs(self) -> list[str]:
        """Jobs this worker has handled since partitions last moved (all of them its own)."""
        return list(self._cache)

    def save_meta(self, job_id: str, meta: JobMeta) -> None:
        self.jobs[job_id.encode()] = meta.encode()

    def start(self, job_id: str, expected_tasks: int, feature_names: list[str], live: bool) -> JobMeta:
        """Register a job (idempotent: a repeated start keeps what the job has learned)."""
        existing = self.meta(job_id)
        if existing is not None:
            return existing
        meta = JobMeta(expected_tasks=expected_tasks, feature_names=feature_names, live=live)
        self.save_meta(job_id, meta)
        return meta

    def job(self, job_id: str) -> OnlineJob | None:
        """The job's `OnlineJob`, from the cache or rebuilt from the tables; None if unknown."""
        cached = self._cache.get(job_id)
        if cached is not None:
            return cached.job
        meta = self.meta(job_id)
        if meta is None:
            return None
        job = self.make_job(job_id, meta)
        evaluated = meta.last_evaluated
        rows = sorted(self._rows(self.tasks, f"{job_id}{SEPARATOR}".encode()))
        for _, payload in rows:
            for task_id, (record, flagged_at) in decode_changes(payload).items():
                job.state.tasks[task_id] = record
                job.state.flagged.pop(task_id, None)
                if flagged_at is not None and evaluated is not None and flagged_at <= evaluated:
                    job.state.flagged[task_id] = flagged_at  # later flags: an uncommitted checkpoint
        job.state.flagged.update(meta.checkpoint_flags)
        job.state.forget_views()
        job.model_version = meta.model_version
        job.fitted_on = meta.fitted_on
        job.calibrated = meta.calibrated
        if meta.model_version > 0:
            self._restore_model(job, meta.model_version)
        next_sequence = int(rows[-1][0].rsplit(SEPARATOR.encode(), 1)[1]) + 1 if rows else 0
        # the job row's flags reach a task row with the job's next write, before a later job row replaces them
        self._cache[job_id] = _CachedJob(meta, job, next_sequence, changed=set(meta.checkpoint_flags))
        return job

    def _restore_model(self, job: OnlineJob, version: int) -> None:
        """Give ``job`` its stored model ``version``; if the row is missing (the changelog lost a
        durable write) or not a model of the worker's method (`ModelRecordError`: never unpickled,
        never run), log it and leave the job fresh, to be refitted at its next checkpoint."""
        model = self.models.get(model_key(job.job_id, version))
        if model is None:
            log.error("job %r: model version %d is missing; refitting", job.job_id, version)
        else:
            try:  # onto a copy: a row rejected half-way must not leave part of its state behind
                job.method = decode_model(model, copy.deepcopy(job.method))
                return
            except ModelRecordError as error:
                log.error("job %r: model version %d rejected (%s); refitting", job.job_id, version, error)
        job.fitted_on = 0
        job.calibrated = False

    @staticmethod
    def _rows(table: MutableMapping[bytes, bytes], prefix: bytes) -> Iterable[tuple[bytes, bytes]]:
        return [(k, v) for k, v in table.items() if k.startswith(prefix)]

    def put_task(self, job: OnlineJob, task_id: str) -> None:
        """Note that a task of ``job`` changed; `write_changes` writes it."""
        self._cached(job.job_id).changed.add(task_id)

    def put_tasks(self, job: OnlineJob, task_ids: Iterable[str]) -> None:
        """`put_task` for each of ``task_ids``."""
        self._cached(job.job_id).changed.update(task_ids)

    def has_changes(self, job_id: str) -> bool:
        """Whether the job has changes no task row carries yet."""
        cached = self._cache.get(job_id)
        return cached is not None and bool(cached.changed)

    def hold(self, job_id: str, position: Position) -> None:
        """Note that the input record at ``position`` made changes of the (cached) job not written yet.

        A job's changes are written at its checkpoints, not per record, and a record may be
        acknowledged only once its changes are written (`holder`)."""
        self._cached(job_id).holding.append(position)
        self._holders[position] = job_id

    def holder(self, position: Position) -> str | None:
        """The job whose next task row writes changes of the input record at ``position``, if any."""
        return self._holders.get(position)

    def _release(self, cached: _CachedJob) -> None:
        for position in cached.holding:
            self._holders.pop(position, None)
        cached.holding = []

    def write_changes(self, job_id: str) -> int:
        """Write the job's changed tasks as one row of the ``tasks`` table; return how many tasks."""
        cached = self._cache.get(job_id)
        if cached is None:
            return 0
        self._release(cached)
        if not cached.changed:
            return 0
        state = cached.job.state
        rows = {
            task_id: task_row(state.tasks[task_id], state.flagged.get(task_id)) for task_id in cached.changed
        }
        self.tasks[changes_key(job_id, cached.next_sequence)] = encode_changes(rows)
        cached.next_sequence += 1
        cached.changed.clear()
        return len(rows)

    def _cached(self, job_id: str) -> _CachedJob:
        cached = self._cache.get(job_id)
        if cached is None:
            raise KeyError(f"job {job_id!r} is not loaded: call JobStore.job first")
        return cached

    def evaluate(self, job_id: str, at: float) -> list[Decision]:
        """Run the job's checkpoint at ``at``; write any new model, not the job row.

        The caller publishes the decisions, makes every write durable, then calls
        `record_evaluation` (see the module docstring for why in that order). The flags go with the
        job row, and with the job's next task row.
        """
        job = self.job(job_id)
        if job is None or self.meta(job_id) is None:
            return []
        self.write_changes(job_id)  # flags of the previous checkpoint that no task row carries yet
        version = job.model_version
        decisions = job.checkpoint(at)
        for d in decisions:
            if d.is_straggler:
                self.put_task(job, d.task_id)
        if job.model_version != version:
            self.models[model_key(job.job_id, job.model_version)] = encode_model(job.method)
        return decisions

    def record_evaluation(self, at: float, job: OnlineJob, meta: JobMeta) -> None:
        """Commit the checkpoint at ``at``: write the job row of ``job``, the object `evaluate` ran.

        Not looked up again: a rebalance between `evaluate` and this call (the agent awaits the
        broker in between) clears the cache, and a job rebuilt from the tables would still name
        the previous model and drop this checkpoint's flags."""
        meta.model_version = job.model_version
        meta.fitted_on = job.fitted_on
        meta.calibrated = job.calibrated
        meta.last_evaluated = at
        meta.checkpoint_flags = {task_id: t for task_id, t in job.state.flagged.items() if t == at}
        self.save_meta(job.job_id, meta)
        self._unacknowledged.add(job.job_id)

    def awaiting_acknowledgement(self, job_id: str) -> bool:
        """Whether the job's last job row may not be on the broker yet: wait before writing the job."""
        return job_id in self._unacknowledged

    def unacknowledged(self) -> frozenset[str]:
        """The jobs whose job rows a flush started now would acknowledge."""
        return frozenset(self._unacknowledged)

    def acknowledged(self, job_ids: Iterable[str]) -> None:
        """The job rows of ``job_ids`` (taken before a flush) are on the broker: retire the models
        they no longer name."""
        for job_id in job_ids:
            self._unacknowledged.discard(job_id)
            meta = self.meta(job_id)
            if meta is not None:
                self.retire_models(job_id, keep=meta.model_version)

    def retire_models(self, job_id: str, keep: int) -> None:
        """Delete the job's models other than version ``keep``; only once the row naming it is durable."""
        current = model_key(job_id, keep)
        for key in self._model_keys(job_id):
            if key != current:
                del self.models[key]

    def _model_keys(self, job_id: str) -> list[bytes]:
        return [k for k, _ in self._rows(self.models, f"{job_id}{SEPARATOR}".encode())]

    def drop(self, job_id: str) -> int:
        """Forget a finished job: delete its rows (tombstones in the changelogs)."""
        keys = [k for k, _ in self._rows(self.tasks, f"{job_id}{SEPARATOR}".encode())]
        for key in keys:
            del self.tasks[key]
        for key in self._model_keys(job_id):
            del self.models[key]
        if job_id.encode() in self.jobs:
            del self.jobs[job_id.encode()]
        cached = self._cache.pop(job_id, None)
        if cached is not None:
            self._release(cached)  # nothing of the job is left to write
        self._unacknowledged.discard(job_id)
        return len(keys)


def new_online_job(make_method: Callable[[], StragglerMethod], settings: Mapping[str, Any]) -> JobFactory:
    """A factory for the store: one fresh method per job, the worker's protocol settings."""

    def factory(job_id: str, meta: JobMeta) -> OnlineJob:
        return OnlineJob(job_id, make_method(), len(meta.feature_names), meta.expected_tasks, **settings)

    return factory
