"""Re-run the runs behind docs/results.md and compare their JSON with the committed files, bit for bit.

Each run is the command docs/results.md prints for it, with its output (and any ``/tmp`` input it
makes) moved into a temporary directory. Run from anywhere; the commands run at the repository root:
``.venv/bin/python docs/results/reproduce.py --list`` or ``--runs usage-fixture,mitigation/synthetic-online``.
Exit code 1 if any compared value differs.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # every documented run set it; the children inherit it

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "docs/results/"
GOOGLE = "--format google-2011 --trace ../shared/traces/google-2011"
SYNTHETIC = "--format synthetic --jobs 40 --seed 0"
POLICIES = "--policies relaunch,speculate,speculate:5,mantri-duplicate"
EVALUATE = ".venv/bin/straggler evaluate"
PYTHON = ".venv/bin/python"


@dataclass(frozen=True)
class Run:
    """One documented command and the JSON file it wrote."""

    section: str
    command: str
    """As docs/results.md prints it (after ``OMP_NUM_THREADS=1``), shell variables expanded."""
    seconds: float
    """Expected wall clock: a figure of docs/results.md (its run times, its commands' comments, or its
    "Checking reproduction" records), or an estimate when ``measured`` is False."""
    measured: bool = True
    setup: tuple[str, ...] = ()
    """Commands that make the run's input first (documented beside it)."""

    @property
    def out(self) -> str:
        words = shlex.split(self.command)
        return words[words.index("--out") + 1]

    @property
    def name(self) -> str:
        return self.out.removeprefix(RESULTS)

    @property
    def output(self) -> str:
        """The compared file, relative to the repository root."""
        return f"{self.out}/summary.json" if self.command.startswith(EVALUATE) else self.out

    @property
    def needs_shared_traces(self) -> bool:
        return "../shared/traces" in self.command


def _evaluate(args: str, out: str) -> str:
    return f"{EVALUATE} {args} --out {RESULTS}{out}"


RUNS = (
    # §1-2, real trace
    Run(
        "§1",
        _evaluate(
            f"{GOOGLE} --checkpoint-seconds 300 --threshold online --methods nurd --workers 2",
            "google-300s-nurd-timing",
        ),
        86.64,
    ),
    # §1-2's protocol runs, re-taken whole on 1cf8d1c (no row merged by merge_rerun.py any more)
    *(
        Run(
            "§1",
            _evaluate(f"{GOOGLE} --checkpoint-seconds 300 --threshold {th} --workers 2", f"google-300s-{th}"),
            seconds,
        )
        for th, seconds in (("online", 235.12), ("oracle", 218.11))
    ),
    *(
        Run(
            "§2",
            _evaluate(
                f"{GOOGLE} --checkpoint-seconds 60 --threshold {th} "
                "--methods nurd,nurd-paper,nurd-nc,gbtr,reactive,tobit --workers 2",
                f"google-60s-{th}",
            ),
            seconds,
        )
        for th, seconds in (("online", 430.23), ("oracle", 381.22))
    ),
    *(
        Run(
            "§2",
            _evaluate(
                f"{GOOGLE} --max-jobs 150 --checkpoint-seconds {cs} --threshold oracle "
                "--methods reactive,gbtr --workers 2",
                f"google-150-largest-{cs}s-oracle",
            ),
            seconds,
        )
        for cs, seconds in ((300, 29.22), (60, 61.69))
    ),
    *(
        Run(
            "§2",
            f"{PYTHON} docs/results/trace_stats.py {GOOGLE} --checkpoint-seconds {cs}{limit} "
            f"--out {RESULTS}trace-stats/google-{cs}s{suffix}.json",
            seconds,
        )
        for cs, limit, suffix, seconds in (
            (300, "", "", 14.01),
            (300, " --max-jobs 150", "-150-largest", 13.01),
            (60, "", "", 22.01),
            (60, " --max-jobs 150", "-150-largest", 20.01),
        )
    ),
    # §3, synthetic (re-taken whole after 81adac2, so nothing merged)
    *(
        Run("§3", _evaluate(f"{SYNTHETIC} --threshold {th} --workers 2", f"synthetic-{th}"), seconds)
        for th, seconds in (("online", 330.26), ("oracle", 240.56))
    ),
    Run(
        "§3",
        _evaluate(
            "--format synthetic --jobs 15 --seed 0 --threshold online "
            "--methods od-hbos,od-iforest,od-knn,od-lof,od-pca,od-ocsvm,od-cblof,od-mcd,nurd,reactive "
            "--workers 2",
            "synthetic-pyod",
        ),
        80.66,
    ),
    # §3's re-run of NURD after the evidence change (merged into google-*/synthetic-* by merge_rerun.py)
    *(
        Run(
            "Discussion",
            _evaluate(
                f"{GOOGLE} --checkpoint-seconds {secs} --threshold {th} --methods nurd --workers 2",
                f"nurd-evidence/google-{secs}s-{th}",
            ),
            90.0 if secs == 300 else 240.0,
            measured=False,
        )
        for secs in (300, 60)
        for th in ("online", "oracle")
    ),
    *(
        Run(
            "Discussion",
            _evaluate(
                f"{SYNTHETIC} --threshold {th} --methods nurd --workers 2", f"nurd-evidence/synthetic-{th}"
            ),
            45.0,
            measured=False,
        )
        for th in ("online", "oracle")
    ),
    # §4, ablations
    *(
        Run(
            "§4",
            _evaluate(
                f"{GOOGLE} --checkpoint-seconds 60 --threshold online --methods nurd --workers 2 "
                f"--drop-features {features}",
                f"ablation-google-{name}",
            ),
            seconds,
        )
        for name, features, seconds in (
            (
                "no-machine",
                "machine_running_tasks,machine_same_job_tasks,machine_failures_1h,machine_slowness,"
                "machine_history",
                113.74,
            ),
            ("no-own-history", "own_evictions,own_failures", 128.11),
            ("no-schedule-delay", "schedule_delay", 131.21),
        )
    ),
    *(
        Run(
            "§4",
            _evaluate(
                f"{SYNTHETIC} --threshold online --methods nurd --workers 2 --drop-features {features}",
                f"ablation-synthetic-{name}",
            ),
            seconds,
        )
        for name, features, seconds in (
            ("no-cpi", "cpi", 43.55),
            ("no-machine-load", "machine_load", 45.58),
            (
                "events-only",
                "cpu_usage,max_cpu,memory_usage,disk_io_time,cpi,mem_accesses_per_instr,"
                "input_bytes_read_rate,machine_load",
                29.08,
            ),
        )
    ),
    Run(
        "§4",
        f"{PYTHON} docs/results/feature_skill.py {SYNTHETIC} --out {RESULTS}feature-skill/synthetic-40.json",
        8.0,
    ),
    Run(
        "§4",
        f"{PYTHON} docs/results/feature_skill.py {GOOGLE} --max-jobs 150 "
        f"--out {RESULTS}feature-skill/google-150-largest.json",
        29.01,
    ),
    # §5
    Run(
        "§5",
        _evaluate(
            "--format google-2011-usage --trace tests/fixtures/usage --min-tasks 50 --checkpoint-seconds 300 "
            "--methods nurd,reactive,gbtr --workers 2",
            "usage-fixture",
        ),
        8.19,
    ),
    # §6-8
    Run(
        "§6",
        _evaluate(
            f"{GOOGLE} --checkpoint-seconds 300 --threshold online --methods start,reactive,nurd --workers 1",
            "start/google-300s-online",
        ),
        110.17,  # the re-take's, with --workers 2 (the first run, with 1 worker: 22:50.53)
    ),
    Run(
        "§6",
        _evaluate(
            f"{SYNTHETIC} --threshold online --methods start,reactive,nurd --workers 1",
            "start/synthetic-online",
        ),
        115.12,  # the re-take's, with --workers 2
    ),
    Run(
        "§6",
        f"{PYTHON} docs/results/start/start_mape.py {SYNTHETIC} --out {RESULTS}start/mape-synthetic.json",
        76.03,
    ),
    Run(
        "§6",
        f"{PYTHON} docs/results/start/start_mape.py {GOOGLE} --checkpoint-seconds 300 "
        f"--out {RESULTS}start/mape-google-300s.json",
        61.03,
    ),
    *(
        Run(
            "§7",
            _evaluate(
                f"{GOOGLE} --checkpoint-seconds 300 --threshold {th} "
                "--methods admm,reactive,nurd --workers 1",
                f"admm/google-300s-{th}",
            ),
            seconds,
        )
        for th, seconds in (("online", 284.59), ("oracle", 128.85))
    ),
    Run(
        "§7",
        _evaluate(
            f"{SYNTHETIC} --threshold online --methods admm,reactive,nurd --workers 1",
            "admm/synthetic-online",
        ),
        178.71,
    ),
    Run(
        "§8",
        _evaluate(
            f"{SYNTHETIC} --threshold online --methods nurd-warm,reactive --workers 2",
            "nurd-warm/synthetic-online",
        ),
        40.0,
        measured=False,
    ),
    Run(
        "§8",
        _evaluate(
            f"{GOOGLE} --checkpoint-seconds 60 --threshold online --methods nurd-warm,reactive --workers 2",
            "nurd-warm/google-60s-online",
        ),
        120.0,
        measured=False,
    ),
    # §9, mitigation
    Run(
        "§9",
        _evaluate(
            f"{SYNTHETIC} --threshold online --methods nurd,gbtr,reactive {POLICIES}",
            "mitigation/synthetic-online",
        ),
        259.0,
    ),
    *(
        Run(
            "§9",
            _evaluate(
                f"{GOOGLE} --threshold online --methods nurd,reactive --checkpoint-seconds {cs} {POLICIES}",
                f"mitigation/google-{cs}s-online",
            ),
            seconds,
        )
        for cs, seconds in ((300, 162.0), (60, 412.0))
    ),
    *(
        Run(
            "§9",
            f"{PYTHON} docs/results/mitigation/frontier.py {trace} "
            f"--out {RESULTS}mitigation/frontier-{name}.json",
            seconds,
            measured=False,
        )
        for trace, name, seconds in (
            (f"{GOOGLE} --checkpoint-seconds 60", "60s", 300.0),
            (f"{GOOGLE} --checkpoint-seconds 300", "300s", 150.0),
            (f"{SYNTHETIC} --checkpoint-seconds 60", "synthetic", 120.0),
        )
    ),
    # §10, calibrated nurd
    Run(
        "§10",
        _evaluate(
            f"{SYNTHETIC} --threshold online --methods nurd,nurd-backtest,nurd-nc,gbtr,reactive "
            "--policies speculate --workers 2",
            "nurd-calibrated/synthetic-online",
        ),
        199.47,
    ),
    Run(
        "§10",
        _evaluate(
            "--format google-2011-usage --trace /tmp/usage60 --checkpoint-seconds 300 --threshold online "
            "--methods nurd,nurd-nc,gbtr,reactive --policies speculate --workers 2",
            "nurd-calibrated/usage-generated-online",
        ),
        54.12,
        setup=(
            f"{PYTHON} scripts/make_usage_trace.py --jobs 60 --seed 7 --window-seconds 300 "
            "--out /tmp/usage60",
        ),
    ),
    Run(
        "§10",
        _evaluate(
            "--format google-2011-usage --trace tests/fixtures/usage --min-tasks 50 --checkpoint-seconds 300 "
            "--threshold online --methods nurd,nurd-nc,gbtr,reactive --policies speculate --workers 2",
            "nurd-calibrated/usage-fixture-online",
        ),
        7.11,
    ),
    *(
        Run(
            "§10",
            _evaluate(
                f"{GOOGLE} --checkpoint-seconds {s} --threshold online --methods nurd,reactive "
                "--policies speculate --workers 2",
                f"nurd-calibrated/google-{s}s-online",
            ),
            seconds,
            measured=False,
        )
        for s, seconds in ((60, 360.0), (300, 150.0))
    ),
    Run(
        "§7",
        f"{PYTHON} docs/results/admm/admm_bytes.py {GOOGLE} --checkpoint-seconds 300 "
        f"--out {RESULTS}admm/admm_bytes.json",
        120.0,
        measured=False,
    ),
    Run(
        "§10",
        f"{PYTHON} docs/results/early_signal.py --jobs 40 --out {RESULTS}nurd-calibrated/early-signal.json",
        60.0,
        measured=False,
    ),
    Run(
        "§10",
        f"{PYTHON} docs/results/feature_rank.py --format synthetic --jobs 40 "
        f"--out {RESULTS}nurd-calibrated/feature-rank-synthetic.json",
        30.0,
        measured=False,
    ),
    Run(
        "§10",
        f"{PYTHON} docs/results/feature_rank.py {GOOGLE} --jobs 20 --checkpoint-seconds 60 "
        f"--out {RESULTS}nurd-calibrated/feature-rank-google-60s.json",
        60.0,
        measured=False,
    ),
    Run(
        "§10",
        f"{PYTHON} docs/results/feature_rank.py --format google-2011-usage --trace /tmp/usage60 --jobs 20 "
        f"--checkpoint-seconds 300 --out {RESULTS}nurd-calibrated/feature-rank-usage-generated.json",
        30.0,
        measured=False,
        setup=(
            f"{PYTHON} scripts/make_usage_trace.py --jobs 60 --seed 7 --window-seconds 300 "
            "--out /tmp/usage60",
        ),
    ),
    Run(
        "§10",
        f"{PYTHON} docs/results/hindsight_frontier.py {SYNTHETIC} "
        f"--out {RESULTS}nurd-calibrated/hindsight-frontier/frontier.json",
        567.0,
    ),
)
RUNS_BY_NAME = {run.name: run for run in RUNS}


def argv_for(command: str, scratch: Path, workers: int | None) -> list[str]:
    """The command's words with outputs and ``/tmp`` paths moved under ``scratch``."""
    words = shlex.split(command)
    if words[:2] == [".venv/bin/straggler", "evaluate"]:
        head = [sys.executable, "-m", "straggler.cli", "evaluate"]
        words = words[2:]
        if workers is not None:
            if "--workers" in words:
                words[words.index("--workers") + 1] = str(workers)
            else:
                words += ["--workers", str(workers)]
    elif words[0] == PYTHON:
        head, words = [sys.executable], words[1:]
    else:
        raise ValueError(f"not a documented command: {command}")
    words = [str(scratch / w.removeprefix("/")) if w.startswith("/tmp/") else w for w in words]
    if "--out" in words:
        i = words.index("--out") + 1
        words[i] = str(scratch / words[i])
    return head + words


WALL_CLOCK_KEYS = frozenset({"train_seconds", "cross_fit_training_wall_seconds", "seconds", "transport"})
"""Keys that hold what a run measures or names afresh (``start_mape.py``'s training times,
``admm_bytes.py``'s exchange times and its Kafka topic, named by the clock): listed, not compared."""
MISSING = object()
"""A key one of two JSON objects lacks."""
NO_ITEM = object()
"""An index past the end of the shorter of two JSON arrays."""


def same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two JSON scalars: same type, same value, NaN equal to NaN, -0.0 not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        )
    return bool(a == b)


def differences(committed: Any, new: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every key path where the two loaded JSON documents differ, with both values (or a sentinel)."""
    if isinstance(committed, dict) and isinstance(new, dict):
        for key in [*committed, *(k for k in new if k not in committed)]:
            yield from differences(committed.get(key, MISSING), new.get(key, MISSING), f"{path}/{key}")
    elif isinstance(committed, list) and isinstance(new, list):
        for i in range(max(len(committed), len(new))):
            yield from differences(
                committed[i] if i < len(committed) else NO_ITEM,
                new[i] if i < len(new) else NO_ITEM,
                f"{path}/{i}",
            )
    elif not same(committed, new):
        yield path or "/", committed, new


def shown(value: Any) -> str:
    if value is MISSING or value is NO_ITEM:
        return "(absent)"
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:05.2f}"


def run_command(argv: Sequence[str], log: Path, bar: tqdm, budget: int) -> tuple[int, float]:
    """Run one command at the repository root, output to ``log``; advance ``bar`` by up to ``budget`` s."""
    started = time.monotonic()
    advanced = 0
    with log.open("a") as out:
        out.write("$ " + shlex.join(argv) + "\n")
        out.flush()
        child = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while child.poll() is None:
            time.sleep(1.0)
            step = int(min(time.monotonic() - started, budget)) - advanced
            bar.update(step)
            advanced += step
    bar.update(budget - advanced)
    return child.returncode, time.monotonic() - started


def unmoved(value: Any, scratch: Path) -> Any:
    """``value`` with the ``/tmp`` paths `argv_for` moved under ``scratch`` named as the command names
    them (a script that records its command, such as feature_rank.py, writes the path it was given)."""
    moved = f"{scratch}/tmp/"
    if isinstance(value, str):
        return value.replace(moved, "/tmp/")
    if isinstance(value, list):
        return [unmoved(v, scratch) for v in value]
    if isinstance(value, dict):
        return {key: unmoved(v, scratch) for key, v in value.items()}
    return value


def reproduce(run: Run, scratch: Path, workers: int | None, bar: tqdm) -> tuple[str, list[str], float]:
    """Re-run one run into ``scratch``; its status, the report lines, and the wall clock it took."""
    log = scratch / "logs" / (run.name.replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    commands = [*run.setup, run.command]
    elapsed = 0.0
    for i, command in enumerate(commands):
        argv = argv_for(command, scratch, workers)
        Path(argv[argv.index("--out") + 1]).parent.mkdir(parents=True, exist_ok=True)
        budget = round(run.seconds) if i == len(commands) - 1 else 0
        code, took = run_command(argv, log, bar, budget)
        elapsed += took
        if code != 0:
            tail = log.read_text().splitlines()[-15:]
            return "failed", [f"exit code {code}: {shlex.join(argv)}", *tail], elapsed
    committed = json.loads((ROOT / run.output).read_text())
    new = unmoved(json.loads((scratch / run.output).read_text()), scratch)
    found = list(differences(committed, new))
    timed = [path for path, _, _ in found if path.rsplit("/", 1)[-1] in WALL_CLOCK_KEYS]
    found = [(path, old, value) for path, old, value in found if path not in timed]
    added = [path for path, old, _ in found if old is MISSING]
    changed = [(path, old, value) for path, old, value in found if old is not MISSING]
    lines = [f"{path}: committed {shown(old)}, re-run {shown(value)}" for path, old, value in changed]
    if timed:
        lines.append(f"{len(timed)} measured or freshly named value(s) not compared: {', '.join(timed[:5])}")
    if added:
        lines.append(
            f"{len(added)} key path(s) only in the re-run (newer summary format): {', '.join(added[:5])}"
        )
    return ("differs" if changed else "identical"), lines, elapsed


def list_runs() -> None:
    print(f"{'run':45} {'section':10} {'expected':>9}  notes")
    for run in RUNS:
        notes = [] if run.measured else ["estimate"]
        if run.needs_shared_traces:
            notes.append("needs ../shared/traces")
        if "start," in run.command:
            notes.append("needs torch")
        if "od-" in run.command:
            notes.append("needs pyod")
        if run.setup:
            notes.append("makes its input first")
        print(f"{run.name:45} {run.section:10} {minutes(run.seconds):>9}  {', '.join(notes)}")
    print(f"\nall {len(RUNS)}: {minutes(sum(r.seconds for r in RUNS))} expected, one at a time, on 2 cores")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--list", action="store_true", help="the runs, with their expected wall clock")
    choice.add_argument("--runs", help="comma-separated run names (see --list)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="evaluator processes (default: as documented; results do not depend on it)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="write the re-runs here instead of a temporary dir"
    )
    args = parser.parse_args(argv)
    if args.list:
        list_runs()
        return 0
    names = [n.strip().removeprefix(RESULTS).rstrip("/") for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS_BY_NAME]
    if unknown:
        print(f"unknown run(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    runs = [RUNS_BY_NAME[n] for n in names]
    differ = False
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        scratch = args.keep.resolve() if args.keep else Path(tmp)
        bar = tqdm(total=sum(round(r.seconds) for r in runs), unit="s", desc="expected time")
        for run in runs:
            bar.set_postfix_str(run.name)
            status, lines, elapsed = reproduce(run, scratch, args.workers, bar)
            differ |= status != "identical"
            tqdm.write(
                f"{run.name}: {status} ({minutes(elapsed)} wall clock, expected {minutes(run.seconds)})"
            )
            for line in lines:
                tqdm.write(f"  {line}")
        bar.close()
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
