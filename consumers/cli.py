"""``straggler mitigate``: run the mitigation consumer until told to stop (or idle)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict
from types import FrameType

from confluent_kafka import KafkaException

from straggler.argtypes import bootstrap_servers, policy, positive_float, positive_int, topic_prefix
from straggler.core.policy_spec import DEFAULT_POLICY, POLICY_SPECS
from straggler.kafka.names import TopicNames
from straggler.kafka.reachability import add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.metrics_export import add_metrics_arguments, check_metrics_port, metrics_off

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_bootstrap_argument(p: argparse.ArgumentParser) -> None:
    """``--bootstrap``, required unless ``$KAFKA_BOOTSTRAP_SERVERS`` gives it."""
    default_bootstrap = os.environ.get(BOOTSTRAP_ENV)
    p.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        default=default_bootstrap,
        required=default_bootstrap is None,
        help=f"broker address (default: ${BOOTSTRAP_ENV})",
    )


@contextlib.contextmanager
def stopping_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while inside (the loop then finishes the record or transaction
    in flight and closes); the previous handlers come back on leaving. Only the main thread may set
    handlers: elsewhere nothing is changed."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``mitigate`` command to the top-level CLI."""
    p = subparsers.add_parser(
        "mitigate",
        help="turn straggler predictions into relaunch commands (transactional, exactly once)",
    )
    add_bootstrap_argument(p)
    p.add_argument("--policy", type=policy, default=DEFAULT_POLICY, help=f"mitigation policy: {POLICY_SPECS}")
    p.add_argument(
        "--checkpoint-seconds",
        type=positive_float,
        default=300.0,
        help="checkpoint interval (Mantri's horizon; how long a race's loser waits for its kill, at most: "
        "a job whose checkpoints come closer, as a live job's do, is priced at its own spacing)",
    )
    p.add_argument("--topic-prefix", type=topic_prefix, default="", help="prefix of every topic name")
    p.add_argument("--group", default="straggler-mitigation", help="consumer group id")
    p.add_argument(
        "--transactional-id", default=None, help="unique per instance (default: <group>-tx, one instance)"
    )
    p.add_argument("--batch-size", type=positive_int, default=500, help="records per transaction, at most")
    p.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=None,
        help="exit after this many seconds without input (default: run until stopped)",
    )
    p.add_argument(
        "--stall-timeout",
        type=positive_float,
        default=None,
        help="restart the consumer when it is silent this long, stuck in librdkafka (default 90 s)",
    )
    p.add_argument(
        "--no-watchdog",
        action="store_true",
        help="run the consumer in this process, without the supervisor that restarts it when stuck",
    )
    add_broker_timeout_argument(p, waits=True)
    add_metrics_arguments(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_mitigate)


def _mitigate(args: argparse.Namespace) -> int:
    from consumers.mitigation import MitigationConsumer, MitigationStats

    check_metrics_port(args)  # the consumer (under the watchdog, its child) binds it for good
    log.info(
        "mitigator: broker %s, topics %s*, group %s, policy %s, checkpoint every %g s, %s%s",
        args.bootstrap,
        args.topic_prefix,
        args.group,
        args.policy,
        args.checkpoint_seconds,
        "no watchdog" if args.no_watchdog else "under the watchdog",
        metrics_off(args.metrics_port),
    )
    options = {
        "bootstrap": args.bootstrap,
        "policy": args.policy,
        "topics": TopicNames(args.topic_prefix),
        "group_id": args.group,
        "transactional_id": args.transactional_id,
        "checkpoint_interval": args.checkpoint_seconds,
        "batch_size": args.batch_size,
        "metrics_port": args.metrics_port,
        "metrics_host": args.metrics_host,
    }
    try:
        consumer = MitigationConsumer(**options)  # validates the options before any child starts
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()
    with stopping_on_signals(stop):  # the loop finishes (commits) the transaction in flight
        try:
            if not wait_for_broker(
                args.bootstrap, args.broker_timeout, stop=stop, on_wait=_say_waiting(args)
            ):
                stats, restarts = MitigationStats(), 0  # stopped before a broker answered
            elif args.no_watchdog:
                stats = consumer.run(stop=stop, idle_timeout=args.idle_timeout)
                restarts = 0
            else:
                from consumers.watchdog import STALL_TIMEOUT_S, supervise

                run = supervise(
                    options,
                    idle_timeout=args.idle_timeout,
                    stall_timeout=args.stall_timeout or STALL_TIMEOUT_S,
                    stop=stop,
                    verbose=args.verbose,
                )
                if run.exit_code != 0:
                    print("error: the mitigation consumer failed (see the log above)", file=sys.stderr)
                    return EXIT_FAILED
                stats, restarts = run.stats, run.restarts
        except KafkaException as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    print(json.dumps({**asdict(stats), "watchdog_restarts": restarts}))
    return EXIT_OK


def _say_waiting(args: argparse.Namespace) -> Callable[[str], None] | None:
    """What the mitigator says, once, while it waits for its broker without a bound (None: with a
    bound it says nothing until it gives up, in one line)."""
    if args.broker_timeout is not None:
        return None

    def say(cause: str) -> None:
        log.warning(
            "no Kafka broker answers at %s (%s); waiting for one (SIGTERM or Ctrl-C stops the mitigator)",
            args.bootstrap,
            cause,
        )

    return say
