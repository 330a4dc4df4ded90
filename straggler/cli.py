"""The ``straggler`` command: one entry point, one module per command group."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from straggler.argtypes import (
    Parser,
    bootstrap_servers,
    comma_list,
    configure_logging,
    method,
    non_negative_float,
    policy,
    port,
    positive_int,
    topic_prefix,
)
from straggler.core.policy_spec import DEFAULT_POLICY, POLICY_SPECS
from straggler.core.registry import DEFAULT_METHODS, method_names
from straggler.evaluation import MITIGATION_POLICIES
from straggler.kafka.reachability import BrokerUnreachable, add_broker_timeout_argument, wait_for_broker
from straggler.kafka.security import add_kafka_config_argument
from straggler.native_calls import install as install_native_calls
from straggler.ports import PortUnavailable, check_port
from straggler.traces.loading import add_trace_arguments, traces_for_command

DESCRIPTION = (
    "Predict stragglers of datacenter jobs online and mitigate them: evaluate methods offline on a "
    "trace, or run the pipeline (worker, mitigator, producer) on Apache Kafka and replay a trace "
    "through it. Each command's --help lists its options and their defaults."
)


def port_and_next(text: str) -> int:
    """A ``--metrics-port`` whose next port (the mitigator's) is a port too."""
    value = port(text)
    if value == 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a port from 1 to 65534 (the next is the mitigator's)"
        )
    return value


def _evaluate(args: argparse.Namespace) -> int:
    from straggler.evaluation import EvaluationConfig, evaluate, summarise
    from straggler.report import markdown_table, write_report

    traces = traces_for_command(args)
    if traces is None:
        return 1
    if args.drop_features:
        try:
            traces = [trace.without_features(args.drop_features) for trace in traces]
        except KeyError as error:
            print(f"error: --drop-features: {error.args[0]}", file=sys.stderr)
            return 2
    config = EvaluationConfig(
        methods=args.methods,
        threshold=args.threshold,
        seed=args.seed,
        refit_growth=args.refit_growth,
        policies=args.policies,
        checkpoint_seconds=args.checkpoint_seconds or 300.0,
    )
    try:
        results = evaluate(traces, config, workers=args.workers)
    except ImportError as error:  # an optional extra a chosen method needs (e.g. torch for START)
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = summarise(results, config)
    summary["half"] = args.half
    command = "straggler " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = write_report(summary, args.out, title=f"Straggler prediction on {args.format}", command=command)
    print(markdown_table(summary))
    print(f"\nwrote {report} and {args.out / 'summary.json'}")
    return 0


def _register_evaluate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("evaluate", help="offline evaluation of straggler methods on a trace")
    add_trace_arguments(p, evaluation=True)
    p.add_argument(
        "--methods",
        type=comma_list(method),
        default=DEFAULT_METHODS,
        help=f"comma-separated, of: {', '.join(method_names())} (default: {','.join(DEFAULT_METHODS)})",
    )
    p.add_argument(
        "--threshold",
        choices=["oracle", "online"],
        default="oracle",
        help="the latency threshold that labels a straggler: the job's final one (oracle) or the one "
        "known at each checkpoint (online)",
    )
    p.add_argument(
        "--refit-growth",
        type=non_negative_float,
        default=0.25,
        help="refit when the finished set grew by this fraction (0: at every checkpoint)",
    )
    p.add_argument("--workers", type=positive_int, default=None, help="processes (default: one per core)")
    p.add_argument(
        "--drop-features",
        type=comma_list(str),
        default=None,
        help="comma-separated features to leave out, an ablation (default: none)",
    )
    p.add_argument(
        "--policies",
        type=comma_list(policy),
        default=MITIGATION_POLICIES,
        help=f"mitigation policies simulated in the closed loop, comma-separated, of: {POLICY_SPECS} "
        f"(default: {','.join(MITIGATION_POLICIES)})",
    )
    p.add_argument("--out", type=Path, required=True, help="directory of report.md and summary.json")
    p.set_defaults(func=_evaluate)


def _train(args: argparse.Namespace) -> int:
    from straggler.core.registry import make_method, save_trained_method

    method = make_method(args.method, args.seed)
    if not method.learns_across_jobs:
        print(f"{args.method} learns within each job; there is nothing to train ahead", file=sys.stderr)
        return 2
    traces = traces_for_command(args)
    if traces is None:
        return 1
    if args.bootstrap is None:
        try:
            trained = method.fit_population(traces)
        except ImportError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    else:
        from straggler.core.admm import Admm
        from straggler.kafka.admm_exchange import kafka_exchange
        from straggler.kafka.names import TopicNames

        if not isinstance(method, Admm):
            print(f"--bootstrap trains only admm over Kafka, not {args.method}", file=sys.stderr)
            return 2
        wait_for_broker(args.bootstrap, args.broker_timeout)
        topic = TopicNames(args.topic_prefix).admm_exchange
        trained = method.fit_population(traces, exchange=kafka_exchange(args.bootstrap, topic))
    save_trained_method(trained, args.out)
    print(f"trained {args.method} on {len(traces)} jobs; wrote {args.out}")
    return 0


def _register_train(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a cross-job method (start, admm) on a training window, for `straggler worker`"
    )
    add_trace_arguments(p)
    p.add_argument("--method", type=method, required=True, help="a cross-job method: start or admm")
    p.add_argument("--out", type=Path, required=True, help="model file (pickle) for `worker --model`")
    p.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        default=None,
        help="admm: run the consensus rounds over this Kafka broker, host:port (default: in this process)",
    )
    p.add_argument(
        "--topic-prefix", type=topic_prefix, default="", help="admm: namespace of the exchange topic"
    )
    add_broker_timeout_argument(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_train)


def _replay(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from straggler.metrics_export import DEFAULT_METRICS_HOST
    from straggler.replay import run_replay

    if args.metrics_port is not None:  # the worker's and the mitigator's, before the broker and the trace
        check_port(DEFAULT_METRICS_HOST, args.metrics_port, "--metrics-port")
        check_port(DEFAULT_METRICS_HOST, args.metrics_port + 1, "--metrics-port + 1, the mitigator's")
    if args.bootstrap is not None:
        wait_for_broker(args.bootstrap, args.broker_timeout)  # before the trace, which may take minutes
    traces = traces_for_command(args)
    if traces is None:
        return 1
    interval = float(min(np.diff(t.checkpoints).min() if len(t.checkpoints) > 1 else 300.0 for t in traces))
    try:
        run_replay(
            traces,
            policy=args.policy,
            out=args.out,
            bootstrap=args.bootstrap,
            method=args.method,
            speed=args.speed,
            seed=args.seed,
            checkpoint_seconds=interval,
            metrics_port=args.metrics_port,
            verbose=args.verbose,
        )
    except (RuntimeError, KafkaException) as exc:  # a stage exited or stalled, no broker
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print((args.out / "report.md").read_text(), end="")
    return 0


def _register_replay(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="closed-loop replay of a trace through Kafka, with a report")
    add_trace_arguments(p)
    p.add_argument("--policy", type=policy, default=DEFAULT_POLICY, help=f"mitigation policy: {POLICY_SPECS}")
    p.add_argument(
        "--method", type=method, default="nurd", help=f"straggler method, of: {', '.join(method_names())}"
    )
    p.add_argument(
        "--speed", type=non_negative_float, default=0.0, help="1 = real time, 0 = as fast as possible"
    )
    p.add_argument(
        "--bootstrap",
        type=bootstrap_servers,
        default=None,
        help="an existing broker (default: start an embedded one)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="directory of report.md, summary.json and the logs"
    )
    p.add_argument(
        "--metrics-port",
        type=port_and_next,
        default=None,
        metavar="PORT",
        help="Prometheus metrics of the worker at 127.0.0.1:PORT, of the mitigator at PORT+1 (default: off)",
    )
    add_broker_timeout_argument(p)
    add_kafka_config_argument(p)
    p.set_defaults(func=_replay)


def build_parser() -> argparse.ArgumentParser:
    from consumers.cli import register as register_mitigate
    from consumers.dask_cli import register as register_dask_executor
    from consumers.liveview import register as register_view
    from pipeline.cli import register as register_worker
    from producers.cli import register as register_produce
    from straggler.kafka.cli import register as register_kafka

    parser = Parser(prog="straggler", description=DESCRIPTION, verbose_option=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    register_kafka(subparsers)
    _register_evaluate(subparsers)
    _register_train(subparsers)
    register_worker(subparsers)
    register_produce(subparsers)
    register_mitigate(subparsers)
    register_dask_executor(subparsers)
    _register_replay(subparsers)
    register_view(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    install_native_calls()  # NURD's library calls, native: bit for bit the public ones, cheaper
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    if getattr(args, "format", "synthetic") != "synthetic" and args.trace is None:
        print(
            f"straggler {args.command}: error: --trace DIR is required for --format {args.format}",
            file=sys.stderr,
        )
        return 2
    if hasattr(args, "kafka_config"):  # a command that talks to Kafka: its security settings first
        from straggler.kafka.config import KafkaAccessError, check_access
        from straggler.kafka.security import PLAINTEXT, SecurityConfigError, apply_kafka_config

        try:
            security = apply_kafka_config(args.kafka_config)
            if security != PLAINTEXT and getattr(args, "bootstrap", None):
                check_access(args.bootstrap, security=security)  # wrong credentials: say so, at once
        except SecurityConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KafkaAccessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    try:
        return int(args.func(args))
    except BrokerUnreachable as exc:  # a command's wait for its broker (--broker-timeout) ran out
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except PortUnavailable as exc:  # a stage's port (--metrics-port, the view's --port) is taken
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
