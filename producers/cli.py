"""``straggler produce``: replay a trace onto the pipeline's topics, open or closed loop."""

from __future__ import annotations

import argparse
import math
import sys

import orjson

from straggler.argtypes import bootstrap_servers, non_negative_float, positive_float, topic_prefix
from straggler.kafka.reachability import add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.traces.loading import add_trace_arguments, traces_for_command

EXIT_OK = 0
EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``produce`` command to the top-level CLI."""
    p = subparsers.add_parser(
        "produce",
        help="replay a trace onto Kafka (task checkpoints, job events), optionally in closed loop",
        description="Replay a trace's checkpoints in global time order (docs/stream-protocol.md) and print "
        "a one-line JSON summary.",
    )
    p.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        default=None,
        help="broker address (default: $KAFKA_BOOTSTRAP_SERVERS, else the running embedded broker, "
        "else 127.0.0.1:9092)",
    )
    add_trace_arguments(p)
    p.add_argument(
        "--speed",
        type=non_negative_float,
        default=0.0,
        help="trace seconds per wall second (0: as fast as possible; pauses are capped at 60 s)",
    )
    p.add_argument(
        "--closed-loop",
        action="store_true",
        help="after each instant, wait for the agent and the mitigation consumer and apply their commands",
    )
    p.add_argument("--topic-prefix", type=topic_prefix, default="", help="prefix of every topic name")
    p.add_argument("--mitigator-group", default="straggler-mitigation", help="consumer group to wait for")
    p.add_argument(
        "--wait-timeout", type=positive_float, default=120.0, help="closed loop: seconds to wait per instant"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_broker_timeout_argument(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_produce)


def _produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from producers.replayer import TraceReplayer
    from straggler.kafka.cli import default_bootstrap
    from straggler.kafka.names import TopicNames

    bootstrap = args.bootstrap or default_bootstrap()
    wait_for_broker(bootstrap, args.broker_timeout)  # before the trace, which may take minutes to load
    traces = traces_for_command(args, progress=not args.quiet)
    if traces is None:
        return EXIT_FAILED
    replayer = TraceReplayer(
        traces,
        bootstrap,
        topics=TopicNames(args.topic_prefix),
        speed=args.speed,
        closed_loop=args.closed_loop,
        seed=args.seed,
        mitigator_group=args.mitigator_group,
        wait_timeout=args.wait_timeout,
        progress=not args.quiet,
        checkpoint_seconds=args.checkpoint_seconds,
    )
    try:
        result = replayer.run()
    except (RuntimeError, KafkaException) as exc:  # ReplayStalled, a missing topic, an unreachable broker
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    summary = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.summary().items()
    }
    print(orjson.dumps(summary).decode())
    if result.delivery_failures:
        print(
            f"error: {result.delivery_failures} deliveries failed: {result.delivery_errors[:3]}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK
