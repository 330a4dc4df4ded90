"""A supervisor that restarts the mitigation consumer when it is stuck inside librdkafka.

After a broker restart, librdkafka's ``send_offsets_to_transaction`` can block forever although it
was given a timeout (confluentinc/librdkafka#5456, #5511). A blocked C call cannot be interrupted
from Python, so the consumer runs in a child process that beats a shared clock at every step that
returns (`MitigationConsumer.heartbeat`). When the beats stop for ``stall_timeout`` seconds the
supervisor kills the child and starts a new one. That is safe by construction: the new instance's
``init_transactions`` fences the old transactional id and aborts its open transaction, and its
state is rebuilt from the committed input offsets, exactly as after a SIGKILL (fault scenario 2).

A child that fails with a Kafka error librdkafka calls retriable and not fatal (a transactional call
that still times out after its retries, seen a minute after a broker restart) is replaced the same
way: a new instance gets past what the old one could not, for the same reason.

The child dies with the supervisor (``PR_SET_PDEATHSIG``), so killing ``straggler mitigate`` kills
the consumer too; a SIGTERM or SIGINT to the supervisor is passed on, and the child finishes the
transaction in flight before it exits.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from consumers.mitigation import MitigationConsumer, MitigationStats
from straggler.argtypes import configure_logging

log = logging.getLogger(__name__)

STALL_TIMEOUT_S = 90.0
"""Default silence after which the child counts as stuck. It must exceed the longest call that does
return: a transactional call is given 15 s, the group's committed offsets up to 60 s."""
_PR_SET_PDEATHSIG = 1


@dataclass
class SupervisedRun:
    """What `supervise` returns: the children's summed counts, and how often it had to restart one."""

    stats: MitigationStats
    restarts: int
    exit_code: int
    """0 when the last child returned normally (stop, idle timeout), 1 when it failed."""


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(
    options: dict[str, Any],
    beat: Synchronized,
    results: multiprocessing.Queue,
    idle_timeout: float | None,
    parent: int,
    restarts: int = 0,
    verbose: bool = False,
) -> None:
    """Run one consumer until stopped or idle; put its stats (or its error) on ``results``. It logs
    as the command does (a spawned process starts without the parent's logging)."""
    configure_logging(verbose)
    _die_with_parent()
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    def heartbeat() -> None:
        beat.value = time.monotonic()

    try:
        consumer = MitigationConsumer(**options, heartbeat=heartbeat)
        consumer.metrics.watchdog_restarts.inc(restarts)  # this child's endpoint carries on the count
        stats = consumer.run(stop=stop, idle_timeout=idle_timeout)
    except Exception as exc:  # reported to the supervisor, which decides
        results.put((failure_kind(exc), f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from exc
    results.put(("stats", asdict(stats)))


def failure_kind(exc: BaseException) -> str:
    """``"transient"`` for a Kafka error librdkafka marks retriable and not fatal (a timeout while a
    restarted broker's coordinator comes back), which a new consumer gets past; ``"error"`` for any
    other failure (a fatal or fenced producer, a bad option), which a new one would repeat."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(error, KafkaError) and error.retriable() and not error.fatal():
        return "transient"
    return "error"


def supervise(
    options: dict[str, Any],
    *,
    idle_timeout: float | None = None,
    stall_timeout: float = STALL_TIMEOUT_S,
    max_restarts: int = 20,
    stop: threading.Event | None = None,
    on_restart: Callable[[int], None] | None = None,
    verbose: bool = False,
    target: Callable[..., None] = _child,
) -> SupervisedRun:
    """Run `MitigationConsumer(**options)` in a child process; restart it when it stalls.

    A child that fails (a fatal Kafka error, a bad option) is not restarted: that is not a stall, and
    a restart would fail the same way. A child killed by a signal it did not ask for (librdkafka
    aborts on some broker restarts), or failing with a transient Kafka error (`failure_kind`), is
    restarted like a stuck one: a restart is as safe as after a SIGKILL. At most ``max_restarts``
    restarts, so a broker that never comes back ends the run instead of looping forever. ``target``
    is the child's body, `_child` (its arguments are `_child`'s).
    """
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    total = MitigationStats()
    restarts = 0
    while True:
        beat = context.Value("d", time.monotonic(), lock=False)
        child = context.Process(
            target=target,
            args=(options, beat, results, idle_timeout, os.getpid(), restarts, verbose),
            name="mitigation-consumer",
        )
        child.start()
        replace = False
        stopping = False
        while child.is_alive():
            child.join(0.5)
            if stop is not None and stop.is_set() and not stopping:
                stopping = True  # the child commits its transaction in flight, then exits
                os.kill(child.pid or 0, signal.SIGTERM)
            silence = time.monotonic() - float(beat.value)
            if child.is_alive() and silence > stall_timeout:
                log.warning(
                    "mitigation consumer silent for %.0f s (stuck in librdkafka?): restarting it", silence
                )
                child.kill()
                child.join()
                replace = True
        kind, payload = _result(results)
        if kind == "none" and not replace and not stopping and (child.exitcode or 0) < 0:
            log.warning("mitigation consumer died of signal %d: restarting it", -(child.exitcode or 0))
            replace = True
        if kind == "stats":
            for f in fields(MitigationStats):
                setattr(total, f.name, getattr(total, f.name) + payload[f.name])
        elif kind == "transient" and not stopping:
            log.warning("mitigation consumer failed with %s (transient): restarting it", payload)
            replace = True
        elif kind in ("error", "transient"):
            log.error("mitigation consumer failed: %s", payload)
        if not replace or (stop is not None and stop.is_set()):
            return SupervisedRun(total, restarts, 0 if kind == "stats" else 1)
        if restarts >= max_restarts:
            log.error("mitigation consumer stalled or failed %d times; giving up", restarts + 1)
            return SupervisedRun(total, restarts, 1)
        restarts += 1
        if on_restart is not None:
            on_restart(restarts)


def _result(results: multiprocessing.Queue) -> tuple[str, Any]:
    """The child's last word, if it said one before it exited (a killed child says nothing)."""
    try:
        return results.get(timeout=1.0)
    except queue.Empty:
        return ("none", None)
