"""The Dask executor: carries out the relaunch commands on a Dask cluster, each command id once.

`DaskExecutor` reads ``relaunch-commands`` (``isolation.level=read_committed``: an aborted
transaction's commands are never seen) and, for the tasks the adapter submitted
(`producers.dask_job`), turns each command into an action on the cluster through
`straggler.core.execution.ExecutionBook`, which decides by the rules every executor follows, the
simulated cluster of the replays as well (`straggler.core.execution.decide`; both are a
`straggler.core.execution.CommandExecutor`):

- ``duplicate``: a copy of the attempt (the same packed call: same function, same arguments) on
  another worker, as the next attempt; the adapter's future resolves to the first that finishes;
- ``kill``: the attempt is cancelled, and its worker's slot freed. Dask's cancel forgets the task
  but cannot stop a thread that runs it: the slot is free once the function returns, at once when
  it calls `straggler.dask_tasks.cancelled()` now and then; after ``kill_grace`` seconds still
  running, its worker is restarted (its nanny starts a fresh process), after the results it holds
  have moved to other workers (a restart would lose them, and Dask would compute them again). That
  wait happens on a thread of its own (`DaskExecutor._free_slot`): the executor carries out the next commands
  meanwhile. A log line and the ``straggler_executor_kill_seconds`` histogram give how long freeing
  the slot took and which way;
- ``relaunch``: the next attempt is started (anywhere but the attempt's worker), then the attempt
  is killed as above.

Applied once: a command's id is recorded in the scheduler's metadata (`Client.set_metadata`) once
it is carried out, then its offset is committed (synchronously). A redelivered command (a restart
before the commit, a new consumer group, a re-issued command) finds its id there and is skipped;
the scheduler outlives every executor process, and it holds the very tasks the ids refer to. The
one window left, a crash between carrying a command out and recording it, is closed by the
attempt numbers: a copy or relaunch of attempt ``a`` is attempt ``a + 1`` with a fixed key, so the
redone command finds that attempt and is skipped (``attempt_exists``); a repeated kill finds the
attempt ended.

A command for a task this cluster does not know, or that has ended, is skipped with a log line and
counted (``straggler_executor_skips_total{kind}``), as is a copy or relaunch decided before the
current run of an attempt that Dask runs again after its worker died, or while that run has not
begun (the scheduler counts the death; the worker that runs it says when the run began:
`straggler.dask_tasks.attempt_run_started`).
A record that is not a valid relaunch command is dead-lettered with the reason (stage ``executor``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer
from distributed import Client, Future, Queue

from consumers.executor_metrics import ExecutorMetrics, ExecutorStats
from consumers.mitigation import ASSIGNMENT_WAIT_S, MEMBER_TIMEOUT_MS, POLL_TIMEOUT_S
from schemas import RelaunchCommand, SchemaError, dead_letter_for, decode, encode
from straggler.core.execution import (
    AttemptStatus,
    Copy,
    Decision,
    ExecutionBook,
    Kill,
    RaceTally,
    Relaunch,
    Skip,
)
from straggler.dask_tasks import (
    TaskRecord,
    applied_metadata_key,
    attempt_key,
    attempt_run_started,
    attempts_queue_name,
    parse_attempt_key,
    plain_key,
    run_attempt,
    task_record_name,
)
from straggler.kafka.config import ClientConfig, consumer_config, producer_config
from straggler.kafka.consume import arrived
from straggler.kafka.names import TopicNames
from straggler.kafka.produce import produce_with_backpressure
from straggler.kafka.reachability import quiet_librdkafka_logger
from straggler.metrics_export import DEFAULT_METRICS_HOST, serving

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0
"""How long a killed attempt may run on before its worker is restarted."""
CONNECT_TIMEOUT_S = 30.0
"""How long to wait for the scheduler at start."""
ATTEMPT_PRIORITY = 1
"""Dask priority of a copy or relaunch (the job's tasks have 0): it runs before the tasks still
queued, since the task it stands for has run, or straggled, already; behind them it would start only
once they all had."""
RESTART_TIMEOUT_S = 60.0
"""Longest wait for a restarted worker to come back."""
STOP_WAIT_S = 5.0
"""How long a stopping executor waits for the slots being freed (a restart under way goes on without
it: the nanny finishes it)."""
SCHEDULER_STATE: dict[str, AttemptStatus] = {
    "memory": "finished",
    "erred": "failed",
    "released": "killed",
    "forgotten": "killed",
}
"""A task's state on the scheduler as an attempt's (any other state: waiting, queued, processing: live)."""
FUTURE_STATUS: dict[str, AttemptStatus] = {"finished": "finished", "error": "failed", "cancelled": "killed"}
"""A Dask future's status as an attempt's (any other status: still live)."""


class DaskExecutor:
    """Carries out relaunch commands on the Dask cluster at ``scheduler``."""

    def __init__(
        self,
        bootstrap: str,
        scheduler: str,
        *,
        topics: TopicNames = TopicNames(),  # noqa: B008 - a frozen value, safe as a default
        group_id: str = "straggler-dask-executor",
        kill_grace: float = KILL_GRACE_S,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_METRICS_HOST,
    ) -> None:
        if not kill_grace >= 0:
            raise ValueError(f"kill_grace must be >= 0, got {kill_grace}")
        self.bootstrap, self.scheduler = bootstrap, scheduler
        self.topics, self.group_id = topics, group_id
        self.kill_grace = kill_grace
        self.book = ExecutionBook()
        self.stats = ExecutorStats()
        self.metrics = ExecutorMetrics(lambda: self.stats)
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        self._ended: queue.SimpleQueue[tuple[str, str, int, AttemptStatus, float]] = queue.SimpleQueue()
        """Attempts whose futures completed (from Dask's callback thread), or whose kill freed their
        slot (from the freeing thread), for the book."""
        self._freeing: dict[Any, threading.Thread] = {}
        """Killed attempts whose slots are being freed, by key: the book counts their machine time
        until the slot is free, not from the cancel."""
        self._watched: dict[Any, Future] = {}
        """Attempts whose end the book waits for, by key: held, so their callbacks stay registered."""
        self._client: Client | None = None

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        idle_timeout: float | None = None,
        max_commands: int | None = None,
    ) -> ExecutorStats:
        """Consume until ``stop`` is set, ``idle_timeout`` seconds pass without a record, or
        ``max_commands`` records are handled; return the counts."""
        # bound first: a port taken fails before Dask and Kafka are contacted
        with serving(self.metrics.registry, self.metrics_port, self.metrics_host):
            return self._run(stop, idle_timeout, max_commands)

    def _run(
        self, stop: threading.Event | None, idle_timeout: float | None, max_commands: int | None
    ) -> ExecutorStats:
        """`run` once its metrics are served."""
        client = Client(self.scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        self._client = client
        quiet = {"logger": quiet_librdkafka_logger()}  # a broker gone: a line every few minutes
        consumer = Consumer({**self._consumer_config(), **quiet})
        letters = Producer({**producer_config(self.bootstrap), **quiet})
        try:
            assigned = threading.Event()
            consumer.subscribe([self.topics.commands], on_assign=lambda *_: assigned.set())
            last_input = started = time.monotonic()
            while not (stop is not None and stop.is_set()):
                if max_commands is not None and self.stats.consumed >= max_commands:
                    break
                self._book_ended_attempts()
                budget = 100 if max_commands is None else max_commands - self.stats.consumed
                records = [m for m in arrived(consumer, budget, POLL_TIMEOUT_S) if _no_error(m)]
                self.metrics.sample_lag(consumer)
                for message in records:
                    self._handle(message, letters)
                    consumer.commit(message=message, asynchronous=False)  # after it was applied
                    self.stats.consumed += 1
                if records:
                    last_input = time.monotonic()
                elif idle_timeout is not None and _idle(assigned.is_set(), started, last_input, idle_timeout):
                    break
        finally:
            consumer.close()
            letters.flush(10.0)
            for freeing in list(self._freeing.values()):
                freeing.join(STOP_WAIT_S)
            self._book_ended_attempts()
            client.close()
            self._client = None
        return self.stats

    def _consumer_config(self) -> ClientConfig:
        config = consumer_config(self.bootstrap, self.group_id, read_committed=True)
        config["session.timeout.ms"] = MEMBER_TIMEOUT_MS  # a killed executor's partitions move sooner
        return config

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the executor is not running")
        return self._client

    def _handle(self, message: Message, letters: Producer) -> None:
        """One record: a valid command is applied or skipped; anything else is dead-lettered."""
        value = message.value()
        error: str | SchemaError
        try:
            event = decode(value)
        except SchemaError as invalid:
            error = invalid
        else:
            if isinstance(event, RelaunchCommand):
                self.apply(event)
                return
            error = (
                f"unexpected {event.EVENT_TYPE} on the commands topic (only relaunch_command is carried out)"
            )
        letter = dead_letter_for(
            value, message.topic(), message.partition(), message.offset(), error, stage="executor"
        )
        produce_with_backpressure(letters, self.topics.dead_letters, encode(letter), message.key())
        if letters.flush(30.0):  # delivered before the offset is committed: never lost
            raise KafkaException(f"dead letter of offset {message.offset()} undelivered")
        self.stats.dead_letters += 1
        self.metrics.dead_letters.count(error)
        log.warning("dead letter: offset %s of %s: %s", message.offset(), message.topic(), letter.error)

    def apply(self, command: RelaunchCommand) -> Decision:
        """Carry out ``command`` unless it was applied before or names no live attempt; return what
        was decided."""
        applied_key = applied_metadata_key(command.command_id)
        if not self.book.is_applied(command.command_id) and self.client.get_metadata(applied_key, None):
            self.book.mark_applied(command.command_id)  # by an earlier executor
        record = self._record(command)
        decision = self.book.decide(command)
        if isinstance(decision, Skip):
            self.stats.skipped += 1
            self.metrics.skipped(decision.kind)
            log.info(
                "command %s: %s of job %s task %s attempt %s skipped (%s): %s",
                command.command_id[:12],
                command.action,
                command.job_id,
                command.task_id,
                command.attempt,
                decision.kind,
                decision.reason,
            )
            return decision
        assert record is not None  # the book knows only tasks whose record was read
        detail = self._carry_out(decision, record)
        self.client.set_metadata(applied_key, {"action": command.action, "at": time.time()})
        self.book.mark_applied(command.command_id)
        self.stats.applied += 1
        self.metrics.commands.labels(command.action).inc()
        self._sync_stats()
        log.info(
            "command %s: applied %s of job %s task %s attempt %s (%s)",
            command.command_id[:12],
            command.action,
            command.job_id,
            command.task_id,
            command.attempt,
            detail,
        )
        return decision

    def tally(self) -> RaceTally:
        """Races won and lost by copies, and the extra attempts' machine time, so far."""
        return self.book.tally()

    def _record(self, command: RelaunchCommand) -> TaskRecord | None:
        """The task's published record, its attempts' states told to the book (None: an unknown
        task, or one whose job has ended)."""
        name = task_record_name(command.job_id, command.task_id)
        record = TaskRecord.from_published(self.client.get_dataset(name, default=None))
        if record is None:  # never published, or its job ended since an earlier command
            self.book.dropped(command.job_id, command.task_id, time.time())
            return None
        numbers = sorted(record.attempts)
        keys = [record.attempts[n].key for n in numbers]
        # from the scheduler: a fresh future's status lags
        views = dict(zip(numbers, self.client.run_on_scheduler(_scheduler_states, keys), strict=True))
        statuses = {n: status for n, (status, _) in views.items()}
        rerun = [n for n, (status, died) in views.items() if status == "live" and died]
        starts = self._run_starts(record, rerun) if command.action != "kill" else {}
        self.book.observe(record.job_id, record.task_id, record.copyable, statuses, time.time(), starts)
        for future in record.attempts.values():
            self._watch(future)
        self.metrics.tasks.set(self.book.tracked)
        return record

    def _run_starts(self, record: TaskRecord, rerun: list[int]) -> dict[int, float]:
        """When each of the ``rerun`` attempts (Dask runs them again: a worker died under them) began
        its current run, asked of the worker that runs it; `math.inf` for one whose new run has not
        begun (queued, not started on its worker, or on a worker that is gone): whatever the command
        was decided on, it was the run that died. Only reruns: a first run's start, on another
        machine's clock, is never compared with the stream's."""
        starts: dict[int, float] = {}
        for number in rerun:
            key = record.attempts[number].key
            worker = self._worker_of(key)
            started = None
            if worker is not None:
                with contextlib.suppress(OSError, KeyError):  # the worker is gone
                    started = self.client.run(attempt_run_started, key, workers=[worker]).get(worker)
            starts[number] = math.inf if started is None else float(started)
        return starts

    def _watch(self, future: Future) -> None:
        """Tell the book when the attempt ends (Dask calls back from its own thread)."""
        parsed = parse_attempt_key(future.key)
        if parsed is None or future.key in self._watched:
            return
        self._watched[future.key] = future
        job_id, task_id, attempt = parsed

        def ended(done: Future) -> None:
            status = FUTURE_STATUS.get(str(done.status), "killed")
            if status == "killed" and done.key in self._freeing:
                return  # the kill's own thread says when its slot is free
            self._ended.put((job_id, task_id, attempt, status, time.time()))

        future.add_done_callback(ended)

    def _book_ended_attempts(self) -> None:
        while True:
            try:
                job_id, task_id, attempt, status, at = self._ended.get_nowait()
            except queue.Empty:
                break
            self.book.attempt_ended(job_id, task_id, attempt, status, at)
            self._watched.pop(attempt_key(job_id, task_id, attempt), None)
        self._sync_stats()

    def _sync_stats(self) -> None:
        tally = self.tally()
        self.stats.copies_won, self.stats.copies_lost = tally.copies_won, tally.copies_lost
        self.stats.extra_machine_seconds = tally.extra_machine_seconds

    def _carry_out(self, decision: Copy | Kill | Relaunch, record: TaskRecord) -> str:
        """Act on the cluster; return what was done, for the log line."""
        attempt = record.attempts[decision.attempt]
        worker = self._worker_of(attempt.key)
        if isinstance(decision, Kill):
            return self._kill(decision.job_id, decision.task_id, decision.attempt, attempt, worker)
        others = [w for w in self.client.scheduler_info()["workers"] if w != worker] or None
        new = self.client.submit(
            run_attempt,
            record.call,
            record.job_id,
            record.task_id,
            decision.new_attempt,
            key=attempt_key(record.job_id, record.task_id, decision.new_attempt),
            pure=False,
            workers=others,
            allow_other_workers=isinstance(decision, Relaunch),  # a copy must not share the original's worker
            priority=ATTEMPT_PRIORITY,
        )
        record.attempts[decision.new_attempt] = new
        name = task_record_name(record.job_id, record.task_id)
        self.client.publish_dataset(record.published(), name=name, override=True)
        Queue(attempts_queue_name(record.job_id), client=self.client).put(new)  # the adapter's future sees it
        copy_of = decision.attempt if isinstance(decision, Copy) else None
        self.book.attempt_added(record.job_id, record.task_id, decision.new_attempt, time.time(), copy_of)
        self._watch(new)
        where = "any worker" if others is None else "another worker"
        started = f"attempt {decision.new_attempt} started on {where}"
        if isinstance(decision, Copy):
            return started
        killed = self._kill(decision.job_id, decision.task_id, decision.attempt, attempt, worker)
        return f"{started}; {killed}"

    def _worker_of(self, key: Any) -> str | None:
        """The worker the scheduler has the attempt processing on (None: queued, or not running)."""
        for worker, keys in self.client.processing().items():
            if any(_same_key(k, key) for k in keys):
                return str(worker)
        return None

    def _kill(self, job_id: str, task_id: str, attempt: int, future: Future, worker: str | None) -> str:
        """Cancel the attempt; its worker's slot is freed on a thread of its own (`_free_slot`), so
        the next commands are carried out meanwhile. Returns what was done, for the log line."""
        if future.key in self._freeing:
            return f"attempt {attempt} is being killed already"
        if worker is not None:  # before the cancel: its callback leaves the booking to the thread
            self._freeing[future.key] = threading.Thread(
                target=self._free_slot,
                args=(job_id, task_id, attempt, future.key, worker, time.monotonic()),
                name=f"free-slot-{job_id}-{task_id}-{attempt}",
                daemon=True,
            )
        self.client.cancel([future], force=True)
        if worker is None:
            self.metrics.kill_seconds.labels("returned").observe(0.0)
            self.book.attempt_ended(job_id, task_id, attempt, "killed", time.time())
            return f"attempt {attempt} killed (it was not running on a worker)"
        self._freeing[future.key].start()
        return f"attempt {attempt} cancelled; its slot on {worker} is being freed"

    def _free_slot(
        self, job_id: str, task_id: str, attempt: int, key: Any, worker: str, started: float
    ) -> None:
        """Wait ``kill_grace`` for the killed attempt's thread to return, else restart its worker;
        then book the attempt as ended, and say how long that took, and how."""
        freed_by = "returned"
        try:
            while self._running_on(worker, key):
                if time.monotonic() - started >= self.kill_grace:
                    freed_by = self._restart(worker)
                    break
                time.sleep(0.05)
        except Exception as exc:  # the client closed under it (the executor stopping): said, not raised
            log.warning("could not see the killed attempt's slot on %s freed: %s", worker, exc)
            freed_by = "stuck"
        finally:
            took = time.monotonic() - started
            self.metrics.kill_seconds.labels(freed_by).observe(took)
            self._ended.put((job_id, task_id, attempt, "killed", time.time()))
            self._freeing.pop(key, None)
        where = f"job {job_id} task {task_id} attempt {attempt}"
        if freed_by == "stuck":
            log.warning(
                "%s: cancelled, but it still runs on %s: its slot frees when it returns", where, worker
            )
            return
        how = "its thread returned" if freed_by == "returned" else "its worker was restarted"
        log.info("%s: slot on %s freed %.2f s after the kill (%s)", where, worker, took, how)

    def _restart(self, worker: str) -> str:
        """Restart ``worker`` under its nanny; "restart", or "stuck" when it cannot be (no nanny, or
        it did not come back in time): the kill is applied all the same, and said to be partial.

        The results the worker holds move to other workers first (``retire_workers`` without closing
        it, which also stops new tasks going there): a restart drops a worker's memory, and Dask would
        run every task whose result was lost again, finished peers of the job included."""
        try:
            self.client.retire_workers([worker], close_workers=False, remove=False)
        except Exception as exc:  # the restart still frees the slot; the lost results are computed again
            log.warning("could not move the results off worker %s before its restart: %s", worker, exc)
        try:
            self.client.restart_workers([worker], timeout=RESTART_TIMEOUT_S)
        except Exception as exc:  # any failure: the attempt is cancelled already, carry on
            log.error("could not restart worker %s to stop a killed attempt: %s", worker, exc)
            return "stuck"
        return "restart"

    def _running_on(self, worker: str, key: Any) -> bool:
        """Whether a thread of ``worker`` still runs the task ``key``."""
        try:
            answers = self.client.run(_runs_key, key, workers=[worker])
        except (OSError, KeyError):  # the worker is gone: nothing runs there
            return False
        return bool(answers.get(worker, False))


def _scheduler_states(keys: list[Any], dask_scheduler: Any = None) -> list[tuple[AttemptStatus, bool]]:
    """On the scheduler (`Client.run_on_scheduler`): each attempt's state as the scheduler has it
    now, and whether a worker died while running it (Dask's ``suspicious`` count: it runs it again)."""
    states: list[tuple[AttemptStatus, bool]] = []
    for key in keys:
        task = dask_scheduler.tasks.get(plain_key(key))
        state = "forgotten" if task is None else task.state
        states.append((SCHEDULER_STATE.get(state, "live"), task is not None and task.suspicious > 0))
    return states


def _runs_key(key: Any, dask_worker: Any = None) -> bool:
    """On a worker (`Client.run`): whether one of its threads runs ``key``."""
    return any(_same_key(running, key) for running in dask_worker.active_keys)


def _same_key(a: Any, b: Any) -> bool:
    """Keys compared across the wire, where a tuple may arrive as a list."""
    return plain_key(a) == plain_key(b)


def _idle(assigned: bool, started: float, last_input: float, idle_timeout: float) -> bool:
    """Whether a bounded run is over: ``idle_timeout`` without input once assigned; before its
    first assignment (a killed member's partitions are held until its session expires) it waits
    at least `ASSIGNMENT_WAIT_S`, as the mitigator does."""
    now = time.monotonic()
    if assigned:
        return now - last_input >= idle_timeout
    return now - started >= max(idle_timeout, ASSIGNMENT_WAIT_S)


def _no_error(message: Message) -> bool:
    error = message.error()
    if error is None:
        return True
    if error.fatal():
        raise KafkaException(error)
    log.warning("consumer: %s", error)
    return False
