"""``straggler broker|topics|smoke``: run the embedded broker, declare the topics, check a round trip."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from confluent_kafka import KafkaException

from straggler.argtypes import bootstrap_servers, port_or_zero, positive_int, topic_prefix
from straggler.kafka.embedded import (
    DEFAULT_PORT,
    BrokerError,
    BrokerTls,
    EmbeddedKafka,
    TlsAddresses,
    embedded_kafka,
)
from straggler.kafka.reachability import add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.kafka.smoke import DEFAULT_MESSAGES, smoke_check
from straggler.kafka.topics import DEFAULT_PARTITIONS, DEFAULT_REPLICATION, create_topics

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``broker``, ``topics`` and ``smoke`` commands to the top-level CLI."""
    broker = subparsers.add_parser("broker", help="run the embedded single-node Kafka broker (KRaft)")
    broker_commands = broker.add_subparsers(dest="broker_command", required=True)

    start = broker_commands.add_parser("start", help="start it in the background; returns once it answers")
    start.add_argument(
        "--port", type=port_or_zero, default=DEFAULT_PORT, help="PLAINTEXT port (0: pick a free one)"
    )
    _add_data_dir(start)
    tls_options = (
        ("--tls-certificate", "the broker's certificate (then any intermediates), PEM, valid for 127.0.0.1"),
        ("--tls-key", "its private key, PEM, PKCS#8, unencrypted"),
        ("--tls-client-ca", "CA certificates (PEM) the MTLS listener accepts client certificates of"),
    )
    for option, text in tls_options:
        start.add_argument(
            option, type=Path, default=None, metavar="FILE", help=f"{text} (TLS listeners: all three or none)"
        )
    start.set_defaults(func=_broker_start)

    status = broker_commands.add_parser("status", help="exit 0 if running, 3 if not")
    _add_data_dir(status)
    status.set_defaults(func=_broker_status)

    stop = broker_commands.add_parser("stop", help="stop it (SIGTERM, then SIGKILL after 30 s)")
    _add_data_dir(stop)
    stop.set_defaults(func=_broker_stop)

    topics = subparsers.add_parser("topics", help="declare the pipeline's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser("create", help="create the topics that do not exist yet")
    create.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        help=f"broker address (default: ${BOOTSTRAP_ENV}, else the running embedded broker, "
        f"else 127.0.0.1:{DEFAULT_PORT})",
    )
    create.add_argument(
        "--partitions", type=positive_int, default=DEFAULT_PARTITIONS, help="partitions of each topic"
    )
    create.add_argument(
        "--replication", type=positive_int, default=DEFAULT_REPLICATION, help="replicas of each partition"
    )
    create.add_argument(
        "--topic-prefix",
        type=topic_prefix,
        default="",
        help="namespace for all topics, as the stages' --topic-prefix",
    )
    add_broker_timeout_argument(create)
    add_kafka_config_argument(create)
    create.set_defaults(func=_topics_create)

    smoke = subparsers.add_parser(
        "smoke", help="produce and consume keyed records through a real broker, on a topic of its own"
    )
    smoke.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        help="broker address (default: start an embedded broker for the duration)",
    )
    smoke.add_argument(
        "--messages", type=positive_int, default=DEFAULT_MESSAGES, help="records to send and read back"
    )
    add_broker_timeout_argument(smoke)
    add_kafka_config_argument(smoke)
    smoke.set_defaults(func=_smoke)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the broker instance's directory (default: <user cache>/straggler-stream/broker)",
    )


def _broker_tls(args: argparse.Namespace) -> BrokerTls | None:
    """The TLS listeners ``broker start`` was asked for (None: none); ValueError unless all three
    files are given, or none."""
    files = (args.tls_certificate, args.tls_key, args.tls_client_ca)
    if all(file is None for file in files):
        return None
    if any(file is None for file in files):
        raise ValueError("--tls-certificate, --tls-key and --tls-client-ca go together")
    missing = [str(file) for file in files if not file.is_file()]
    if missing:
        raise ValueError(f"not a readable file: {', '.join(missing)}")
    return BrokerTls(args.tls_certificate, args.tls_key, args.tls_client_ca)


def _print_tls(addresses: TlsAddresses | None) -> None:
    if addresses is not None:
        print(f"tls:       {addresses.tls} (SSL)")
        print(f"mtls:      {addresses.mtls} (SSL, client certificate required)")


def _broker_start(args: argparse.Namespace) -> int:
    try:
        tls = _broker_tls(args)
    except ValueError as exc:
        print(f"straggler broker start: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    broker = EmbeddedKafka(port=args.port, data_dir=args.data_dir, tls=tls)
    try:
        bootstrap = broker.start()
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if tls is not None and broker.tls_addresses() is None:
        print(
            f"error: the broker already running on {broker.data_dir} has no TLS listeners; "
            "stop it first (straggler broker stop)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    reused = "" if broker.started_here else " (already running)"
    print(f"bootstrap: {bootstrap}{reused}")
    _print_tls(broker.tls_addresses())
    print(f"log file:  {broker.log_file}")
    return EXIT_OK


def _broker_status(args: argparse.Namespace) -> int:
    status = EmbeddedKafka(data_dir=args.data_dir).status()
    if not status.running:
        print(f"not running (data dir {status.data_dir})")
        return EXIT_NOT_RUNNING
    print(f"running: pid {status.pid}, bootstrap {status.bootstrap}")
    if status.tls is not None:
        print(f"tls: {status.tls.tls}, mtls: {status.tls.mtls} (client certificate required)")
    print(f"log file: {status.log_file}")
    return EXIT_OK


def _broker_stop(args: argparse.Namespace) -> int:
    broker = EmbeddedKafka(data_dir=args.data_dir)
    print("stopped" if broker.stop() else f"not running (data dir {broker.data_dir})")
    return EXIT_OK


def default_bootstrap() -> str:
    """``$KAFKA_BOOTSTRAP_SERVERS``, else the default embedded broker if it runs, else 127.0.0.1:9092."""
    from_env = os.environ.get(BOOTSTRAP_ENV)
    if from_env:
        return from_env
    status = EmbeddedKafka().status()
    if status.running and status.bootstrap is not None:
        return status.bootstrap
    return f"127.0.0.1:{DEFAULT_PORT}"


def _topics_create(args: argparse.Namespace) -> int:
    bootstrap = args.bootstrap or default_bootstrap()
    wait_for_broker(bootstrap, args.broker_timeout)
    try:
        created = create_topics(
            bootstrap, partitions=args.partitions, replication=args.replication, prefix=args.topic_prefix
        )
    except KafkaException as exc:
        print(f"error: creating topics on {bootstrap} failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"created {len(created)} topic(s) on {bootstrap}: {', '.join(created) or '(all existed)'}")
    return EXIT_OK


def _smoke(args: argparse.Namespace) -> int:
    if args.bootstrap:
        wait_for_broker(args.bootstrap, args.broker_timeout)
        return EXIT_OK if smoke_check(args.bootstrap, args.messages).ok else EXIT_FAILED
    try:
        with embedded_kafka() as bootstrap:
            return EXIT_OK if smoke_check(bootstrap, args.messages).ok else EXIT_FAILED
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
