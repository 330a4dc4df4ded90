"""``straggler worker``: run the Faust NURD agent."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import faust
    from faust.worker import Worker

    from pipeline.settings import WorkerSettings

from straggler.argtypes import (
    LOG_LEVELS,
    OWN_LOGGERS,
    bootstrap_servers,
    existing_file,
    non_negative_float,
    non_negative_int,
    online_method,
    positive_float,
    positive_int,
    topic_prefix,
)
from straggler.core.abandonment import CAP_S, FLOOR_S, TASK_MULTIPLE
from straggler.core.registry import online_method_names
from straggler.kafka.reachability import add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.metrics_export import add_metrics_arguments, check_metrics_port, metrics_off

log = logging.getLogger(__name__)


def _worker(args: argparse.Namespace) -> int:
    check_metrics_port(args)  # a port taken: one line, exit 2, before the broker and the start line
    wait_for_broker(args.bootstrap, args.broker_timeout)  # before Faust and its clients, which retry for ever
    from pipeline.app import Worker, create_changelog_topics
    from pipeline.settings import WorkerSettings
    from straggler.kafka.names import TopicNames
    from straggler.kafka.topics import wait_for_topics

    settings = WorkerSettings(
        bootstrap=args.bootstrap,
        method=args.method,
        model_path=None if args.model is None else str(args.model),
        topics=TopicNames(args.topic_prefix),
        partitions=args.partitions,
        live_interval=args.live_interval,
        pending_grace=args.pending_grace,
        abandon_after=args.abandon_after,
        seed=args.seed,
        datadir=args.datadir,
        admm_interval=args.admm_interval,
    )
    names = settings.topics
    needed = [names.checkpoints, names.job_events, names.predictions, names.dead_letters]
    # before Faust, which would log UNKNOWN_TOPIC_OR_PART for ever
    wait_for_topics("worker", settings.bootstrap, needed, names.prefix, log.warning, then=log.info)
    mismatch = _partition_mismatch(settings)
    if mismatch:
        raise SystemExit(f"error: {mismatch}")
    create_changelog_topics(settings)
    if settings.admm_interval is not None:
        from pipeline.admm_online import create_topics

        create_topics(settings)
    app = Worker(settings).app
    log.info(
        "worker: broker %s, topics %s*, %d partitions, method %s%s, "
        "live jobs at their own tasks' pace (every 1-%g s), abandoned after %s%s",
        settings.bootstrap,
        settings.topics.prefix,
        settings.partitions,
        settings.method,
        "" if settings.model_path is None else f" (model {settings.model_path})",
        settings.live_interval,
        "their own task lengths" if settings.abandon_after is None else f"{settings.abandon_after:g} s",
        metrics_off(args.metrics_port),
    )
    if args.metrics_port is not None:  # bound, then said where (by serve)
        from straggler.metrics_export import serve

        serve(app.straggler_metrics.registry, args.metrics_port, args.metrics_host)  # type: ignore[attr-defined]
    quiet_worker(app, "debug" if args.verbose else args.loglevel).execute_from_commandline()
    return 0


class ExpectedAtStart(logging.Filter):
    """Turns aiokafka's ERROR ``Group Coordinator Request failed: GroupCoordinatorNotAvailableError``
    into a DEBUG line during the worker's first ``grace`` seconds, and only then.

    A broker answers so while it creates its offsets topic (a group's first start on a new broker)
    or moves the group's coordinator; aiokafka retries, and the worker goes on. Later, the same
    error stays an ERROR: the coordinator did not come."""

    MESSAGE = "Group Coordinator Request failed: %s"

    def __init__(self, grace: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.until = clock() + grace

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        expected = (
            record.msg == self.MESSAGE
            and len(args) == 1
            and type(args[0]).__name__ == "GroupCoordinatorNotAvailableError"
            and self.clock() < self.until
        )
        if not expected:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"


def quiet_worker(app: faust.App, loglevel: str) -> Worker:
    """Faust's Worker for ``app``, logging at ``loglevel`` (this package's loggers at INFO at least)
    and without its progress spinner.

    The spinner sets the root logger to DEBUG (its handler turns at every record), so every debug
    call in Faust, mode and aiokafka builds a record that the log handler then drops: about 6 % of a
    busy worker's time (docs/performance.md, "What bounds throughput").
    """
    from faust.worker import Worker

    own = {name: {"level": "DEBUG" if loglevel == "debug" else "INFO"} for name in OWN_LOGGERS}
    handler = {"level": "DEBUG", "class": "colorlog.StreamHandler", "formatter": "colored"}
    # Faust's own records at ``loglevel``, this package's at INFO at least (its start, its jobs)
    logging_config = {"merge": True, "handlers": {"default": handler}, "loggers": own}
    worker = Worker(app, loglevel=loglevel, quiet=True, logging_config=logging_config)
    worker.spinner = None
    logging.getLogger(COORDINATOR_LOGGER).addFilter(ExpectedAtStart())
    return worker


def _partition_mismatch(settings: WorkerSettings) -> str | None:
    """Why the input topics do not have ``--partitions`` partitions (None when they do, or do not exist
    yet): records are forwarded to their job's murmur2 partition of that count, which must be real."""
    from straggler.kafka.topics import partition_count

    names = settings.topics
    for topic in (names.checkpoints, names.job_events):
        try:
            actual = partition_count(settings.bootstrap, topic)
        except KeyError:
            continue
        if actual != settings.partitions:
            return f"topic {topic!r} has {actual} partitions; start the worker with --partitions {actual}"
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("worker", help="run the Faust NURD agent (partitioned by job id)")
    p.add_argument(
        "--bootstrap", type=bootstrap_servers, required=True, help="Kafka bootstrap servers, host:port"
    )
    p.add_argument(
        "--method",
        type=online_method,
        default="nurd",
        help=f"straggler method, of: {', '.join(online_method_names())}",
    )
    p.add_argument(
        "--model",
        type=existing_file,
        default=None,
        help="a cross-job method's file from `straggler train` (default: none)",
    )
    p.add_argument(
        "--topic-prefix",
        type=topic_prefix,
        default="",
        help="namespace for all topics (tests, several replays)",
    )
    p.add_argument(
        "--partitions", type=positive_int, default=8, help="must equal the input topics' partition count"
    )
    p.add_argument(
        "--live-interval",
        type=positive_float,
        default=30.0,
        help="the longest spacing of a live job's evaluations; each job is evaluated every tenth of "
        "its median task, at least every 1 s, and at this spacing until a task finished "
        "(README, 'Live telemetry')",
    )
    p.add_argument(
        "--pending-grace",
        type=non_negative_float,
        default=30.0,
        help="seconds a task event may wait for its job's 'started' event before it is dead-lettered",
    )
    p.add_argument(
        "--abandon-after",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="close a live job that has not reported for SECONDS as abandoned, freeing its state "
        f"(default: {TASK_MULTIPLE:g} x the job's longest task time so far, at least {FLOOR_S:g} s, "
        f"at most {CAP_S:g} s)",
    )
    p.add_argument(
        "--admm-interval",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="with --method admm and no --model: learn it in the stream, one consensus round over the "
        "partitions at most every SECONDS (pipeline/admm_online.py); predicts no straggler before round 1 "
        "(default: off)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="the method's random seed")
    add_metrics_arguments(p)
    p.add_argument("--datadir", default=None, help="Faust data directory (default: per app id, in the cwd)")
    p.add_argument(
        "--loglevel",
        type=str.lower,
        choices=LOG_LEVELS,
        default="warning",
        help="Faust's log level (the worker's own lines: info, or debug with -v)",
    )
    add_broker_timeout_argument(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_worker)
