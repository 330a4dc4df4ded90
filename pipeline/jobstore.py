"""Each job's `OnlineJob`, kept in Faust tables so a restarted or rebalanced worker gets it back.

Tables ``jobs`` (one row per job: its protocol state and the last checkpoint it committed),
``tasks`` (the tasks a job changed between two commits, one row per job and commit) and ``models``
(each refit's method as data, `straggler.core.model_codec`, never a pickle), all on the job's own
changelog partition. Between commits the in-memory jobs are the truth; a commit writes what changed
(`pipeline.group_commit.GroupCommit.commit` gives the order, and why a killed worker recovers
exactly). Details: docs/architecture.md, "The worker's tables and recovery".
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


CLOSED_ROW_SECONDS = 600.0
"""How long a closed job's row stays (`JobMeta.closed_at`): far longer than a dead worker's successor
takes to read the job's records again (Faust commits input offsets every second)."""

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
    """The row of the ``jobs`` table: a job's protocol state and the last checkpoint it committed."""

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
    started_at: float | None = None
    """Its ``started`` event's time: a live job silent since is abandoned (`straggler.core.abandonment`)."""
    checkpoint_flags: dict[str, float] = field(default_factory=dict)
    """The flags raised since the job's last task row (task id -> flag time), until one carries them."""
    closed_at: float | None = None
    """When the worker closed the job (wall clock): ended and evaluated to its end, or abandoned. Its
    tasks and models are deleted then; this row stays `CLOSED_ROW_SECONDS`, so that its records up to
    ``ended_at``, read again by a worker that took over before Faust committed their offsets, are
    known as handled instead of starting the job again from a part of them."""

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, payload: bytes) -> JobMeta:
        return cls(**orjson.loads(payload))

    def took_checkpoint(self, job: OnlineJob, at: float, flagged: Iterable[str]) -> None:
        """Note the checkpoint ``job`` has just evaluated at ``at``, and the tasks it flagged."""
        self.model_version, self.fitted_on, self.calibrated = job.model_version, job.fitted_on, job.calibrated
        self.last_evaluated = at
        self.checkpoint_flags.update(dict.fromkeys(flagged, at))

    def restore(self, job: OnlineJob) -> None:
        """Give a job rebuilt from the tables what this row committed (but its model)."""
        job.model_version, job.fitted_on, job.calibrated = self.model_version, self.fitted_on, self.calibrated
        job.state.flagged.update(self.checkpoint_flags)


JobFactory = Callable[[str, JobMeta], OnlineJob]


@dataclass
class _CachedJob:
    meta: JobMeta
    job: OnlineJob
    next_sequence: int
    meta_changed: bool = False
    """The job row differs from the table's: the next commit writes it."""
    changed: set[str] = field(default_factory=set)
    """Tasks changed since the job's last task row: the next commit writes them as one row."""


@dataclass
class JobStore:
    """Each job's `OnlineJob` in memory, written to the three tables at each group commit.

    Between commits the cache is the jobs' truth; `write_job_rows` and `write_task_rows` make it
    durable, in the order `pipeline.group_commit.GroupCommit.commit` gives."""

    tasks: MutableMapping[bytes, bytes]
    jobs: MutableMapping[bytes, bytes]
    models: MutableMapping[bytes, bytes]
    make_job: JobFactory
    _cache: dict[str, _CachedJob] = field(default_factory=dict)
    _ended: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Jobs dropped since the last commit (job -> its end, when it was closed): the commit deletes
    their tasks and models and writes their closed rows."""

    def forget_cache(self) -> None:
        """Partitions moved: what is cached may no longer be ours, or may be stale. Changes not
        written yet go with it: the worker releases the records that made them, unacknowledged."""
        self._cache.clear()
        self._ended.clear()

    def meta(self, job_id: str) -> JobMeta | None:
        """The job's row as cached (loading the job): change it in place, then call `meta_changed`."""
        cached = self._cache.get(job_id)
        if cached is None and self.job(job_id) is not None:
            cached = self._cache[job_id]
        return None if cached is None else cached.meta

    def cached_jobs(self) -> list[str]:
        """Jobs this worker has handled since partitions last moved (all of them its own)."""
        return list(self._cache)

    def held_jobs(self) -> list[str]:
        """Every job this worker holds: the cached ones and those of its partitions' ``jobs`` rows
        (a job that sent nothing since a restart is in the table only; a closed one too, which
        `peek_meta` does not give)."""
        tabled = (key.decode() for key in list(self.jobs.keys()))
        return list(dict.fromkeys([*self._cache, *(j for j in tabled if j not in self._ended)]))

    def peek_meta(self, job_id: str) -> JobMeta | None:
        """The job's row, from the cache or read from the table without loading the job."""
        cached = self._cache.get(job_id)
        return cached.meta if cached is not None else self._open_row(job_id)

    def closed_end(self, job_id: str) -> float | None:
        """The end of ``job_id`` if the worker closed it (its row says so, or the next commit will);
        None for an open or unknown job."""
        if job_id in self._cache:
            return None
        if job_id in self._ended:
            return self._ended[job_id][0]
        meta = self._stored_row(job_id)
        return None if meta is None or meta.closed_at is None else meta.ended_at

    def _stored_row(self, job_id: str) -> JobMeta | None:
        """The job's row as the ``jobs`` table holds it (None: no row)."""
        payload = self.jobs.get(job_id.encode())
        return None if payload is None else JobMeta.decode(payload)

    def _open_row(self, job_id: str) -> JobMeta | None:
        """The job's row if the job is open: neither dropped since the last commit nor closed."""
        meta = None if job_id in self._ended else self._stored_row(job_id)
        return None if meta is None or meta.closed_at is not None else meta

    def open_jobs(self) -> int:
        """How many jobs the table holds open (its closed rows left out)."""
        return sum(JobMeta.decode(payload).closed_at is None for payload in list(self.jobs.values()))

    def expire_closed(self, now: float, keep_for: float = CLOSED_ROW_SECONDS) -> None:
        """Delete the closed rows older than ``keep_for`` at wall-clock ``now``."""
        for key, payload in list(self.jobs.items()):
            closed_at = JobMeta.decode(payload).closed_at
            if closed_at is not None and now - closed_at > keep_for:
                del self.jobs[key]

    def uncache(self, job_id: str) -> None:
        """Drop a job from the cache if it holds no change (it loads again from the tables)."""
        cached = self._cache.get(job_id)
        if cached is not None and not cached.meta_changed and not cached.changed:
            del self._cache[job_id]

    def start(
        self,
        job_id: str,
        expected_tasks: int,
        feature_names: list[str],
        live: bool,
        started_at: float | None = None,
    ) -> JobMeta:
        """Register a job (idempotent: a repeated start keeps what the job has learned)."""
        existing = self.meta(job_id)
        if existing is not None:
            return existing
        meta = JobMeta(
            expected_tasks=expected_tasks, feature_names=feature_names, live=live, started_at=started_at
        )
        self._cache[job_id] = _CachedJob(meta, self.make_job(job_id, meta), 0, meta_changed=True)
        return meta

    def meta_changed(self, job_id: str) -> None:
        """The (cached) job's row changed: the next commit writes it."""
        self._cached(job_id).meta_changed = True

    def name_features(self, job_id: str, feature_names: list[str]) -> OnlineJob:
        """Give a job started without feature names (so without tasks yet) the names of its first
        observation: a fresh `OnlineJob` with that many features."""
        cached = self._cached(job_id)
        cached.meta.feature_names = feature_names
        cached.meta_changed = True
        cached.job = self.make_job(job_id, cached.meta)
        return cached.job

    def job(self, job_id: str) -> OnlineJob | None:
        """The job's `OnlineJob`, from the cache or rebuilt from the tables (and cached); None if unknown.

        For the agent only: what it caches is the job's truth until the next commit."""
        cached = self._cache.get(job_id)
        if cached is None:
            cached = self._load(job_id)
            if cached is not None:
                self._cache[job_id] = cached
        return None if cached is None else cached.job

    def peek(self, job_id: str) -> OnlineJob | None:
        """The job's tasks as `job` gives them, never cached and without its model: for readers beside
        the agent (the ADMM round timer), which may run while a recovery is still filling the tables.
        A job loaded half-way and cached would be the agent's truth from then on, its missing tasks
        lost."""
        cached = self._cache.get(job_id)
        if cached is None:
            cached = self._load(job_id, with_model=False)
        return None if cached is None else cached.job

    def _load(self, job_id: str, with_model: bool = True) -> _CachedJob | None:
        """The job rebuilt from the tables (its model too, unless not ``with_model``); None if unknown,
        closed, or dropped since the last commit."""
        meta = self._open_row(job_id)
        if meta is None:
            return None
        job = self.make_job(job_id, meta)
        rows = sorted(self._rows(self.tasks, f"{job_id}{SEPARATOR}".encode()))
        for _, payload in rows:
            for task_id, (record, flagged_at) in decode_changes(payload).items():
                job.state.tasks[task_id] = record
                job.state.flagged.pop(task_id, None)
                if flagged_at is not None:
                    job.state.flagged[task_id] = flagged_at
        meta.restore(job)
        job.state.forget_views()
        if with_model and meta.model_version > 0:
            self._restore_model(job, meta.model_version)
        next_sequence = int(rows[-1][0].rsplit(SEPARATOR.encode(), 1)[1]) + 1 if rows else 0
        # the job row's flags reach a task row with the job's next commit
        return _CachedJob(meta, job, next_sequence, changed=set(meta.checkpoint_flags))

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

    def put_tasks(self, job: OnlineJob, task_ids: Iterable[str]) -> None:
        """Note that tasks of ``job`` changed: the next commit writes them."""
        self._cached(job.job_id).changed.update(task_ids)

    def _cached(self, job_id: str) -> _CachedJob:
        cached = self._cache.get(job_id)
        if cached is None:
            raise KeyError(f"job {job_id!r} is not loaded: call JobStore.job first")
        return cached

    def evaluate(self, job_id: str, at: float) -> list[Decision]:
        """Run the job's checkpoint at ``at``. A refit's model is written at once, under a version
        key no job row names until the next commit writes this job's row."""
        job = self.job(job_id)
        if job is None:
            return []
        cached = self._cached(job_id)
        version = job.model_version
        decisions = job.checkpoint(at)
        flagged = [d.task_id for d in decisions if d.is_straggler]
        cached.changed.update(flagged)
        cached.meta.took_checkpoint(job, at, flagged)
        cached.meta_changed = True
        if job.model_version != version:
            self.models[model_key(job_id, job.model_version)] = encode_model(job.method)
        return decisions

    def write_job_rows(self) -> list[str]:
        """Delete the tasks and models of the jobs dropped since the last commit (tombstones in the
        changelogs) and write their closed rows, then write the job rows that changed; the jobs written."""
        for job_id, (ended_at, closed_at) in self._ended.items():
            for table in (self.tasks, self.models):
                for key, _ in self._rows(table, f"{job_id}{SEPARATOR}".encode()):
                    del table[key]
            if job_id not in self._cache:  # else started again: its new row follows
                closed = JobMeta(0, [], live=False, ended_at=ended_at, closed_at=closed_at)
                self.jobs[job_id.encode()] = closed.encode()
        self._ended.clear()
        written = [job_id for job_id, cached in self._cache.items() if cached.meta_changed]
        for job_id in written:
            cached = self._cache[job_id]
            self.jobs[job_id.encode()] = cached.meta.encode()
            cached.meta_changed = False
        return written

    def write_task_rows(self) -> None:
        """Write each job's tasks changed since the last commit as one row of the ``tasks`` table."""
        for job_id, cached in self._cache.items():
            if not cached.changed:
                continue
            state = cached.job.state
            rows = {task: task_row(state.tasks[task], state.flagged.get(task)) for task in cached.changed}
            self.tasks[changes_key(job_id, cached.next_sequence)] = encode_changes(rows)
            cached.next_sequence += 1
            cached.changed.clear()
            cached.meta.checkpoint_flags = {}  # a task row carries them now (the job row's copy is stale)

    def retire_models(self, job_ids: Iterable[str]) -> None:
        """Delete the models that the (durable) job rows of ``job_ids`` no longer name."""
        for job_id in job_ids:
            meta = self.meta(job_id)
            if meta is not None:
                current = model_key(job_id, meta.model_version)
                for key in self._model_keys(job_id):
                    if key != current:
                        del self.models[key]

    def _model_keys(self, job_id: str) -> list[bytes]:
        return [k for k, _ in self._rows(self.models, f"{job_id}{SEPARATOR}".encode())]

    def drop(self, job_id: str, ended_at: float, now: float) -> None:
        """Forget a job that ended at ``ended_at`` (closed at wall-clock ``now``); the next commit
        deletes its tasks and models and leaves its closed row."""
        self._cache.pop(job_id, None)
        self._ended[job_id] = (ended_at, now)


def new_online_job(make_method: Callable[[], StragglerMethod], settings: Mapping[str, Any]) -> JobFactory:
    """A factory for the store: one fresh method per job, the worker's protocol settings."""

    def factory(job_id: str, meta: JobMeta) -> OnlineJob:
        return OnlineJob(job_id, make_method(), len(meta.feature_names), meta.expected_tasks, **settings)

    return factory
