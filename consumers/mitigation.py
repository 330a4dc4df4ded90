"""The mitigation consumer: straggler verdicts in, relaunch commands out, exactly once per decision.

`MitigationConsumer` runs the pure fold `consumers.fold.MitigationState` (input records in; commands
and dead letters out, aligned on event time) in a transactional consume-transform-produce loop: one
transaction per batch (commands, dead letters, input offsets). After an assignment or abort it
rebuilds the state by folding the input up to the committed offsets (`consumers.fold.Rebuild`). A
closed-loop driver waits until the committed offsets pass both the marker and the boundary.
Inputs: co-partitioned, range-assigned.

Event-time alignment, the rebuild and deployment: docs/architecture.md, "The mitigation consumer".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers.fold import MitigationState, Output, Rebuild
from consumers.metrics import MitigationMetrics
from schemas import MitigationNote, RelaunchCommand, encode
from straggler.kafka.config import ClientConfig, consumer_config, producer_config
from straggler.kafka.consume import arrived
from straggler.kafka.names import TopicNames, ready_line
from straggler.kafka.produce import produce_with_backpressure
from straggler.kafka.reachability import quiet_librdkafka_logger, wait_for_broker
from straggler.kafka.topics import wait_for_topics
from straggler.metrics_export import DEFAULT_METRICS_HOST, serving

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
"""Longest a consume call blocks, so ``stop`` and ``idle_timeout`` are noticed within about this."""
MEMBER_TIMEOUT_MS = 10_000
"""How soon the group notices a killed instance (librdkafka's default is 45 s)."""
ASSIGNMENT_WAIT_S = 3 * MEMBER_TIMEOUT_MS / 1000
"""How long a bounded run (``idle_timeout``) waits for its first assignment."""
REBUILD_TIMEOUT_S = 300.0
"""Give up (raise) when a rebuild has not reached the committed offsets by then; stays under the
default ``max.poll.interval.ms`` (300 s) only when the rebuild starts promptly."""
COMMITTED_TIMEOUT_S = 60.0
"""Longest wait for the group's committed offsets (they wait for a pending transaction to finish)."""
TXN_RETRIES = 5
"""Retries of a retriable ``send_offsets_to_transaction``/``commit_transaction`` before aborting."""
TXN_CALL_TIMEOUT_S = 15.0
"""Longest a transactional call may block. librdkafka's default is to wait forever: after a broker
restart, ``send_offsets_to_transaction`` with the group metadata of a session that has meanwhile timed
out never returned. A timeout is retriable; when the retries are spent the batch is aborted and
rewound (so a restart of the broker costs a redo of the batch, never a hung consumer)."""
TXN_RETRY_BACKOFF_MS = 10
"""The producer's first retry backoff (librdkafka's default: 100 ms). A transaction that starts right
after the previous one committed can be refused while the coordinator completes that one
(CONCURRENT_TRANSACTIONS) and is retried after the backoff: with the default, one
``send_offsets_to_transaction`` in ten took 100 ms in the demo, on the closed loop's path. Later
retries of one request still back off exponentially, up to ``retry.backoff.max.ms``."""


@dataclass
class MitigationStats:
    """Counts of committed work (records of aborted transactions are not counted)."""

    consumed: int = 0
    predictions: int = 0
    checkpoints: int = 0
    """``checkpoint_evaluated`` markers acted on (handed to the policy)."""
    commands: int = 0
    dead_letters: int = 0
    transactions: int = 0
    aborts: int = 0
    rebuilt_records: int = 0
    """Input records folded again (without producing) to rebuild the state after assignments and aborts."""


class MitigationConsumer:
    """Reads predictions, task checkpoints and job events; writes relaunch commands transactionally."""

    def __init__(
        self,
        bootstrap: str,
        policy: str,
        *,
        topics: TopicNames = TopicNames(),  # noqa: B008 - a frozen value, safe as a default
        group_id: str = "straggler-mitigation",
        transactional_id: str | None = None,
        checkpoint_interval: float = 300.0,
        batch_size: int = 500,
        heartbeat: Callable[[], None] | None = None,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_METRICS_HOST,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.transactional_id = transactional_id or f"{group_id}-tx"
        self.checkpoint_interval = checkpoint_interval
        self.batch_size = batch_size
        self.heartbeat = heartbeat
        """Called at every step that returns (poll, transactional call, rebuild batch): a supervisor
        (`consumers.watchdog`) that stops hearing it knows the process is stuck inside librdkafka."""
        self.policy_spec = policy
        self._state = MitigationState(  # pure; also validates the spec
            policy, checkpoint_interval, lettered_topics=[topics.predictions]
        )
        self._stats = MitigationStats()
        self._last_input = time.monotonic()
        self._assigned = False
        self._ready = False
        """Said so (`ready_line`), once: at its first assignment."""
        self.metrics = MitigationMetrics(lambda: self._stats)
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        """Where `run` serves ``self.metrics`` (None: nowhere, the registry is still kept)."""

    @property
    def inputs(self) -> list[str]:
        return [self.topics.predictions, self.topics.checkpoints, self.topics.job_events]

    def process(
        self, msg_value: bytes | None, topic: str, partition: int, offset: int, key: bytes | None = None
    ) -> list[Output]:
        """The fold step the loop runs for every record (see `MitigationState.process`)."""
        return self._state.process(msg_value, topic, partition, offset, key)

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        idle_timeout: float | None = None,
        max_messages: int | None = None,
    ) -> MitigationStats:
        """Consume until ``stop`` is set, ``idle_timeout`` seconds pass without input (counted from the
        last record or assignment), or ``max_messages`` records are processed; return the counts.

        Before its first assignment the consumer waits at least `ASSIGNMENT_WAIT_S` whatever
        ``idle_timeout`` says: after a crash the group holds the partitions until the dead member's
        session expires, and that is not an idle input.

        It first serves its metrics, if given a port (taken: `straggler.ports.PortUnavailable`), then
        waits, quietly and without a bound, for a broker to answer (saying so once; ``stop`` ends the
        wait): a transactional producer's ``init_transactions`` would block unstoppably.
        Returns between transactions, so nothing is left open. Fatal Kafka errors (e.g. fenced by a newer
        instance with the same transactional id) raise `KafkaException`.
        """
        self._stats = MitigationStats()
        # bound first: a port taken fails at once, not after the broker answers
        with serving(self.metrics.registry, self.metrics_port, self.metrics_host):
            return self._run(stop, idle_timeout, max_messages)

    def _run(
        self, stop: threading.Event | None, idle_timeout: float | None, max_messages: int | None
    ) -> MitigationStats:
        """`run` once its metrics are served."""
        if not wait_for_broker(self.bootstrap, None, stop=stop, beat=self._beat, on_wait=self._say_waiting):
            return self._stats  # stopped before a broker answered; else init_transactions would block
        pause = stop if stop is not None else threading.Event()

        def wait(seconds: float) -> None:
            self._beat()
            pause.wait(seconds)

        needed = [*self.inputs, self.topics.commands, self.topics.dead_letters, self.topics.notes]
        if not wait_for_topics(
            "mitigator",
            self.bootstrap,
            needed,
            self.topics.prefix,
            log.warning,
            stopped=pause.is_set,
            sleep=wait,
            then=log.info,
        ):
            return self._stats  # stopped while its topics were missing
        # a broker gone: its connection failures once every few minutes, not several a second
        quiet = {"logger": quiet_librdkafka_logger()}
        consumer = Consumer({**self._consumer_config(), **quiet})
        try:
            producer = Producer({**self._producer_config(), **quiet})
            producer.init_transactions()  # fences an older instance and aborts what it left open
            consumer.subscribe(self.inputs, on_assign=self._on_assign)
            self._assigned = False
            self._last_input = started = time.monotonic()
            while not (stop is not None and stop.is_set()):
                self._beat()
                budget = self.batch_size
                if max_messages is not None:
                    budget = min(budget, max_messages - self._stats.consumed)
                    if budget <= 0:
                        break
                records = self._consume(consumer, budget)
                producer.poll(0)  # hands its log lines to the quiet logger (there are no delivery callbacks)
                self.metrics.sample_lag(consumer)
                if records:
                    self._last_input = time.monotonic()
                    self._transact(consumer, producer, records)
                elif idle_timeout is not None:
                    now = time.monotonic()
                    if self._assigned and now - self._last_input >= idle_timeout:
                        break
                    if not self._assigned and now - started >= max(idle_timeout, ASSIGNMENT_WAIT_S):
                        break
        finally:
            consumer.close()  # leaves the group at once, so the partitions move without a timeout
        return self._stats

    def _input_partitions(self, consumer: Consumer) -> int:
        """The partition count of ``task-checkpoints`` (assigned, so it exists): where a job's records
        belong (murmur2)."""
        topic = self.topics.checkpoints
        described = consumer.list_topics(topic, timeout=COMMITTED_TIMEOUT_S).topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise KafkaException(f"cannot describe input topic {topic!r}")
        return len(described.partitions)

    def _say_waiting(self, cause: str) -> None:
        log.warning("no Kafka broker answers at %s (%s); waiting for one", self.bootstrap, cause)

    def _beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat()

    def _consumer_config(self) -> ClientConfig:
        config = consumer_config(self.bootstrap, self.group_id, read_committed=True)
        config["partition.assignment.strategy"] = "range"  # co-partitioned topics to one member
        config["session.timeout.ms"] = MEMBER_TIMEOUT_MS
        return config

    def _producer_config(self) -> ClientConfig:
        config = producer_config(self.bootstrap, transactional_id=self.transactional_id)
        config.setdefault("partitioner", "murmur2_random")  # Java's and Faust's key -> partition
        config["retry.backoff.ms"] = TXN_RETRY_BACKOFF_MS
        return config

    def _consume(self, consumer: Consumer, budget: int) -> list[Message]:
        records = []
        for message in arrived(consumer, budget, POLL_TIMEOUT_S):
            error = message.error()
            if error is None:
                records.append(message)
            elif error.fatal():
                raise KafkaException(error)
            else:
                log.warning("consumer: %s", error)
        return records

    def _transact(self, consumer: Consumer, producer: Producer, records: Sequence[Message]) -> None:
        """One batch, one transaction: its commands, its dead letters and its input offsets."""
        state = self._state
        before = (state.predictions, state.checkpoints, state.commands, state.dead_letters)
        produced: list[Output] = []
        caused_at: list[float] = []
        """Per command, the produce time of the record that caused it (for the latency metric)."""
        producer.begin_transaction()
        try:
            for message in records:
                outputs = self.process(
                    message.value(),
                    message.topic() or "",
                    message.partition() or 0,
                    message.offset() or 0,
                    message.key(),
                )
                produced += outputs
                commands = sum(isinstance(output, RelaunchCommand) for output in outputs)
                if commands:
                    kind, stamp = message.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE:
                        caused_at += [stamp / 1000.0] * commands
                for output in outputs:
                    if isinstance(output, RelaunchCommand):
                        self._produce(producer, self.topics.commands, output.job_id.encode(), encode(output))
                    elif isinstance(output, MitigationNote):
                        self._produce(producer, self.topics.notes, output.job_id.encode(), encode(output))
                    else:
                        self._produce(producer, self.topics.dead_letters, message.key(), encode(output))
            self._beat()
            _retrying(lambda: self._send_offsets(producer, consumer), self._beat)
            _retrying(lambda: producer.commit_transaction(TXN_CALL_TIMEOUT_S), self._beat)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            abortable = isinstance(error, KafkaError) and (error.txn_requires_abort() or error.retriable())
            if not abortable or error is None or error.fatal():
                _abort_quietly(producer)
                raise
            log.warning("aborting transaction: %s", error)
            _retrying(lambda: producer.abort_transaction(TXN_CALL_TIMEOUT_S), self._beat)
            self._stats.aborts += 1
            self._rewind(consumer)
            return
        except BaseException:
            _abort_quietly(producer)
            raise
        stats = self._stats
        stats.transactions += 1
        stats.consumed += len(records)
        stats.predictions += state.predictions - before[0]
        stats.checkpoints += state.checkpoints - before[1]
        stats.commands += state.commands - before[2]
        stats.dead_letters += state.dead_letters - before[3]
        self.metrics.committed(produced, len(state.active_jobs))
        self.metrics.commands_committed(time.time(), caused_at)
        log.debug(
            "transaction %d: %d records, %d commands, %d dead letters",
            stats.transactions,
            len(records),
            state.commands - before[2],
            state.dead_letters - before[3],
        )

        for output in produced:
            if isinstance(output, RelaunchCommand):
                log.info(
                    "command %s: %s of job %s task %s attempt %s (%s)",
                    output.command_id[:12],
                    output.action,
                    output.job_id,
                    output.task_id,
                    output.attempt,
                    output.reason,
                )
            elif isinstance(output, MitigationNote):
                log.info(
                    "job %s task %s attempt %d flagged, %s",
                    output.job_id,
                    output.task_id,
                    output.attempt,
                    output.reason,
                )

    def _send_offsets(self, producer: Producer, consumer: Consumer) -> None:
        """Put the consumer's positions in the transaction (partitions it has not read are skipped)."""
        positions = consumer.position(consumer.assignment())
        producer.send_offsets_to_transaction(
            positions, consumer.consumer_group_metadata(), TXN_CALL_TIMEOUT_S
        )

    @staticmethod
    def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes) -> None:
        produce_with_backpressure(producer, topic, value, key)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Rebuild the state of the new assignment, then start reading where the group committed."""
        consumer.assign(self._restore(consumer, partitions))
        if not self._ready:
            self._ready = True
            writes = [self.topics.commands, self.topics.dead_letters]
            log.info(ready_line("mitigator", self.bootstrap, self.inputs, writes, len(partitions)))
        self._assigned = True
        self._last_input = time.monotonic()

    def _rewind(self, consumer: Consumer) -> None:
        """After an abort: back to the committed offsets, with the state as of those offsets."""
        for start in self._restore(consumer, consumer.assignment()):
            consumer.seek(start)

    def _restore(self, consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Replace the state by the fold of the committed input; return where to continue reading."""
        self._beat()
        committed = consumer.committed(partitions, timeout=COMMITTED_TIMEOUT_S) if partitions else []
        targets = {(tp.topic, tp.partition): tp.offset for tp in committed if tp.offset >= 0}
        state = MitigationState(
            self.policy_spec,
            self.checkpoint_interval,
            self._input_partitions(consumer),
            lettered_topics=[self.topics.predictions],
        )
        folded = self._fold_committed(state, targets)
        self._state = state
        self._stats.rebuilt_records += folded
        log.info("rebuilt the state of %d partitions from %d records", len(partitions), folded)
        return [
            TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in committed
        ]

    def _fold_committed(self, state: MitigationState, targets: dict[tuple[str, int], int]) -> int:
        """Fold every record before ``targets`` (exclusive end offsets) into ``state``; outputs dropped."""
        if not targets:
            return 0
        config = consumer_config(self.bootstrap, f"{self.group_id}-rebuild", read_committed=True)
        config["enable.partition.eof"] = True  # the end of a partition ends its rebuild (below)
        reader = Consumer(config)
        rebuild = Rebuild(state, targets)
        deadline = time.monotonic() + REBUILD_TIMEOUT_S
        try:
            reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for topic, p in targets])
            while rebuild.remaining:
                self._beat()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"state rebuild did not reach the committed offsets of {rebuild.remaining}"
                    )
                reading = set(rebuild.remaining)
                for message in arrived(reader, self.batch_size, POLL_TIMEOUT_S):
                    topic, partition = message.topic() or "", message.partition() or 0
                    error = message.error()
                    if error is None:
                        rebuild.fold(message.value(), topic, partition, message.offset() or 0, message.key())
                    elif error.code() == KafkaError._PARTITION_EOF:
                        rebuild.reached((topic, partition))
                    elif error.fatal() and (topic, partition) in reading:
                        raise KafkaException(error)
                for where in reading - set(rebuild.remaining):
                    reader.pause([TopicPartition(*where)])
        finally:
            reader.close()
        return rebuild.records


def _retrying(call: Callable[[], object], beat: Callable[[], None] = lambda: None) -> None:
    """Run a transactional call again while it fails with a retriable error (librdkafka's advice for
    ``send_offsets_to_transaction`` and ``commit_transaction``); other errors go to the caller."""
    for attempt in range(TXN_RETRIES + 1):
        beat()
        try:
            call()
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and error.retriable() and not error.txn_requires_abort()
            if not retriable or attempt == TXN_RETRIES:
                raise
            log.info("retrying after %s", error)


def _abort_quietly(producer: Producer) -> None:
    """Best-effort abort on the way out of an error (the error being raised matters more)."""
    try:
        producer.abort_transaction(5.0)
    except KafkaException as exc:
        log.debug("abort after error failed: %s", exc)
