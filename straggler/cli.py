"""The ``straggler`` command: one entry point, one module per command group."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def _evaluate(args: argparse.Namespace) -> int:
    from straggler.core.registry import DEFAULT_METHODS, method_names
    from straggler.evaluation import EvaluationConfig, evaluate, summarise
    from straggler.report import markdown_table, write_report
    from straggler.traces.loading import load_traces

    methods = tuple(args.methods.split(",")) if args.methods else DEFAULT_METHODS
    unknown = sorted(set(methods) - set(method_names()))
    if unknown:
        print(f"unknown method(s): {', '.join(unknown)}; known: {', '.join(method_names())}", file=sys.stderr)
        return 2
    traces = load_traces(
        args.format,
        args.trace,
        checkpoint_seconds=args.checkpoint_seconds,
        min_tasks=args.min_tasks,
        max_jobs=args.max_jobs,
        jobs=args.jobs,
        seed=args.seed,
    )
    if not traces:
        print("no job in the trace meets --min-tasks", file=sys.stderr)
        return 1
    config = EvaluationConfig(methods=methods, threshold=args.threshold, seed=args.seed)
    results = evaluate(traces, config, workers=args.workers)
    summary = summarise(results, config)
    command = "straggler " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = write_report(summary, args.out, title=f"Straggler prediction on {args.format}", command=command)
    print(markdown_table(summary))
    print(f"\nwrote {report} and {args.out / 'summary.json'}")
    return 0


def _register_evaluate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("evaluate", help="offline evaluation of straggler methods on a trace")
    p.add_argument("--format", required=True, choices=["google-2011", "google-2011-usage", "synthetic"])
    p.add_argument("--trace", type=Path, help="trace directory (not needed for synthetic)")
    p.add_argument("--jobs", type=int, default=20, help="synthetic: number of jobs to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-jobs", type=int, default=None, help="evaluate only the N largest jobs")
    p.add_argument("--min-tasks", type=int, default=100)
    p.add_argument("--methods", default=None, help="comma-separated (default: NURD variants and baselines)")
    p.add_argument("--threshold", choices=["oracle", "online"], default="oracle")
    p.add_argument(
        "--checkpoint-seconds", type=float, default=None, help="default 300 (Google), 60 (synthetic)"
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_evaluate)


def build_parser() -> argparse.ArgumentParser:
    from pipeline.cli import register as register_worker
    from straggler.kafka.cli import register as register_kafka

    parser = argparse.ArgumentParser(prog="straggler", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    register_kafka(subparsers)
    _register_evaluate(subparsers)
    register_worker(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
