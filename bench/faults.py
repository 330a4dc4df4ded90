"""Run the fault scenarios against real brokers and print what was lost, duplicated or crashed.

    python bench/faults.py [--scenario NAME ...] [--quick] [--repeat N] [--bootstrap HOST:PORT]

Without ``--bootstrap`` an embedded broker is started (and stopped) for the run; ``broker-restart``
always starts its own, because it stops it. The last line is ``lost=N duplicated=N crashed=N`` summed
over the scenarios; the exit status is 0 only when every scenario passed.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:  # the scenarios are test harness (tests/harness), run here as a file
    sys.path.insert(0, str(TESTS))

from harness.fault_scenarios import SCENARIOS, ScenarioResult, Sizes  # noqa: E402

COLUMNS = (
    "scenario",
    "events in",
    "faults",
    "cmds expected",
    "delivered",
    "lost",
    "duplicated",
    "dead letters",
    "recovery s",
    "decisions",
    "crashed",
    "result",
)


def row(result: ScenarioResult) -> list[str]:
    recovery = "-" if math.isnan(result.recovery_seconds) else f"{result.recovery_seconds:.1f}"
    decisions = (
        f"equal ({result.decisions_expected})"
        if result.decisions_equal
        else f"DIFFER (-{result.decisions_missing} +{result.decisions_extra} ~{result.conflicting})"
    )
    return [
        result.name,
        str(result.events_in),
        str(result.faults),
        str(result.commands_expected),
        str(result.commands_delivered),
        str(result.lost),
        str(result.duplicated),
        str(result.dead_letters),
        recovery,
        decisions,
        str(result.crashed),
        "pass" if result.ok else "FAIL",
    ]


def table(results: list[ScenarioResult]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller jobs, 1,000 bad events instead of 10,000"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each scenario N times (a fault that hits a race shows as a pass rate below N of N)",
    )
    parser.add_argument(
        "--bootstrap", default=None, help="an existing broker (default: start an embedded one)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sizes = Sizes.quick() if args.quick else Sizes.full()
    names = args.scenario or list(SCENARIOS)
    results: list[ScenarioResult] = []
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="straggler-faults-"))
        bootstrap = args.bootstrap
        if bootstrap is None and any(name != "broker-restart" for name in names):
            from straggler.kafka.embedded import embedded_kafka

            bootstrap = stack.enter_context(embedded_kafka(data_dir=workdir / "broker"))
        for name in [name for name in names for _ in range(args.repeat)]:
            started = time.monotonic()
            print(f"# {name} ...", file=sys.stderr, flush=True)
            try:
                result = SCENARIOS[name](bootstrap or "", workdir, sizes)
            except Exception as error:  # a scenario that blows up is a failed scenario, not a lost run
                result = ScenarioResult(name, crashed=1, notes=[f"scenario raised {error!r}"])
            results.append(result)
            print(
                f"# {name}: {'pass' if result.ok else 'FAIL'} in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
            for note in result.notes:
                print(f"#   {note}", file=sys.stderr)
    if all(r.ok for r in results):
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"# logs kept in {workdir}", file=sys.stderr)
    print(table(results))
    if args.repeat > 1:
        passed = Counter(r.name for r in results if r.ok)
        print("passed: " + ", ".join(f"{name} {passed[name]} of {args.repeat}" for name in names))
    lost = sum(r.lost for r in results)
    duplicated = sum(r.duplicated for r in results)
    crashed = sum(r.crashed for r in results)
    print(f"lost={lost} duplicated={duplicated} crashed={crashed}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
