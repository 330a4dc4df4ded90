"""``straggler dask-executor``: carry out relaunch commands on a Dask cluster until told to stop."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
from dataclasses import asdict

from confluent_kafka import KafkaException

from consumers.cli import EXIT_FAILED, EXIT_OK, add_bootstrap_argument, stopping_on_signals
from straggler.argtypes import non_negative_float, positive_float, topic_prefix
from straggler.kafka.names import TopicNames
from straggler.kafka.reachability import add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.metrics_export import add_metrics_arguments, check_metrics_port, metrics_off

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
SCHEDULER_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+]*://)?[^\s:/]+:(\d{1,5})")
log = logging.getLogger(__name__)


def scheduler_address(text: str) -> str:
    """A Dask scheduler's address: ``[tcp://]host:port``."""
    match = SCHEDULER_ADDRESS.fullmatch(text.strip())
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected [tcp://]host:port")
    return text.strip()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dask-executor`` command to the top-level CLI."""
    default_scheduler = os.environ.get(SCHEDULER_ENV)
    p = subparsers.add_parser(
        "dask-executor",
        help="carry out relaunch commands (duplicate, kill, relaunch) on a Dask cluster, each once",
    )
    add_bootstrap_argument(p)
    p.add_argument(
        "--scheduler",
        type=scheduler_address,
        default=default_scheduler,
        required=default_scheduler is None,
        help=f"the Dask scheduler, [tcp://]host:port (default: ${SCHEDULER_ENV})",
    )
    p.add_argument("--topic-prefix", type=topic_prefix, default="", help="prefix of every topic name")
    p.add_argument("--group", default="straggler-dask-executor", help="consumer group id")
    p.add_argument(
        "--kill-grace",
        type=non_negative_float,
        default=2.0,
        help="seconds a killed attempt may run on (it stops sooner if it checks cancelled()) before "
        "its worker is restarted",
    )
    p.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=None,
        help="exit after this many seconds without a command (default: run until stopped)",
    )
    add_broker_timeout_argument(p)
    add_metrics_arguments(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_execute)


def _execute(args: argparse.Namespace) -> int:
    check_metrics_port(args)  # before Dask and Kafka; `DaskExecutor.run` binds it for good
    from consumers.dask_executor import DaskExecutor

    log.info(
        "dask executor: broker %s, topics %s*, group %s, scheduler %s, kill grace %g s%s",
        args.bootstrap,
        args.topic_prefix,
        args.group,
        args.scheduler,
        args.kill_grace,
        metrics_off(args.metrics_port),
    )
    executor = DaskExecutor(
        args.bootstrap,
        args.scheduler,
        topics=TopicNames(args.topic_prefix),
        group_id=args.group,
        kill_grace=args.kill_grace,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    stop = threading.Event()
    with stopping_on_signals(stop):
        if not wait_for_broker(args.bootstrap, args.broker_timeout, stop=stop):  # else one line, exit 1
            return EXIT_OK  # stopped before a broker answered
        try:
            stats = executor.run(stop=stop, idle_timeout=args.idle_timeout)
        except (KafkaException, OSError) as exc:  # no broker; no scheduler (Dask raises OSError)
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    print(json.dumps(asdict(stats)))
    return EXIT_OK
