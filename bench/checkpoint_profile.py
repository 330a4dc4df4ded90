"""Where `OnlineJob.checkpoint` spends its time, per checkpoint and by part, without a broker.

Runs synthetic jobs through `OnlineJob` as the evaluator does (`straggler.core.recorded_run`,
online threshold) and times each part by wrapping it: the views (`JobState.finished`/`running`), the
online threshold, the method's fit (of which XGBoost and the ranking calibration) and predict. Pure:
no Kafka, no subprocess; the model-cost figure of docs/performance.md, one checkpoint at a time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/checkpoint_profile.py [--jobs 3] [--tasks 1000] [--repeat 3]
    OMP_NUM_THREADS=1 .venv/bin/python bench/checkpoint_profile.py --profile  # also a pyinstrument tree
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file, not as a module of the package
    sys.path.insert(0, str(REPO))

import xgboost as xgb  # noqa: E402

from straggler.core import jobstate, nurd, online  # noqa: E402
from straggler.core.jobtrace import JobTrace  # noqa: E402
from straggler.core.recorded_run import recorded_decisions  # noqa: E402
from straggler.evaluation import EvaluationConfig, online_job  # noqa: E402
from straggler.native_calls import install as install_native_calls  # noqa: E402
from straggler.traces.synthetic import generate_jobs  # noqa: E402

PARTS: list[tuple[str, Any, str]] = [
    ("views", jobstate.JobState, "finished"),
    ("views", jobstate.JobState, "finished_view"),
    ("views", jobstate.JobState, "running"),
    ("views", jobstate.JobState, "running_view"),
    ("threshold", online, "online_threshold"),
    ("fit", nurd.Nurd, "fit"),
    ("fit.xgboost", nurd.GradientBoostedLatency, "fit"),
    ("fit.calibration", nurd.CalibratedGate, "_calibrate_ranking"),
    ("predict", nurd.Nurd, "predict"),
    ("xgboost.predict", xgb.Booster, "inplace_predict"),
]
"""(part, owner, attribute): the callables timed (those that exist). Parts nest (fit.xgboost is
inside fit)."""


@contextmanager
def timed_parts(seconds: dict[str, float]) -> Iterator[None]:
    """Wrap every callable of `PARTS` so that its wall time adds to ``seconds[part]`` (outermost
    call only, so recursion is not counted twice)."""
    saved = []
    depth: dict[str, int] = defaultdict(int)
    for part, owner, name in PARTS:
        if not hasattr(owner, name):
            continue
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def wrapper(*args: Any, __f: Callable[..., Any] = original, __p: str = part, **kwargs: Any) -> Any:
            depth[__p] += 1
            began = time.process_time()
            try:
                return __f(*args, **kwargs)
            finally:
                depth[__p] -= 1
                if depth[__p] == 0:
                    seconds[__p] += time.process_time() - began

        setattr(owner, name, functools.wraps(original)(wrapper))
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def run(traces: list[JobTrace], method: str) -> tuple[int, float, dict[str, float], int]:
    """Checkpoints, total seconds in `OnlineJob.checkpoint`, seconds by part, decisions."""
    config = EvaluationConfig(methods=(method,), threshold="online")
    seconds: dict[str, float] = defaultdict(float)
    checkpoints, decisions = 0, 0
    original = online.OnlineJob.checkpoint

    def checkpoint(self: online.OnlineJob, at: float) -> list[online.Decision]:
        began = time.process_time()
        out = original(self, at)
        seconds["checkpoint"] += time.process_time() - began
        return out

    online.OnlineJob.checkpoint = checkpoint  # type: ignore[method-assign]
    try:
        with timed_parts(seconds):
            for trace in traces:
                for verdicts in recorded_decisions(online_job(trace, method, config), trace):
                    checkpoints += 1
                    decisions += len(verdicts)
    finally:
        online.OnlineJob.checkpoint = original  # type: ignore[method-assign]
    return checkpoints, seconds.pop("checkpoint"), dict(seconds), decisions


def main() -> None:
    install_native_calls()  # as the worker does (`straggler.cli.main`)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoint-seconds", type=float, default=60.0)
    parser.add_argument("--method", default="nurd")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a pyinstrument tree of one run")
    args = parser.parse_args()
    traces = generate_jobs(
        args.jobs,
        seed=args.seed,
        min_tasks=args.tasks,
        max_tasks=args.tasks,
        checkpoint_seconds=args.checkpoint_seconds,
    )
    print(f"load average {os.getloadavg()[0]:.2f}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    names = ["views", "threshold", "fit", "fit.xgboost", "fit.calibration", "predict", "xgboost.predict"]
    print(f"{'run':>4} {'ckpts':>6} {'decisions':>9} {'ms/ckpt':>8} " + " ".join(f"{n:>15}" for n in names))
    for r in range(args.repeat):
        n, total, parts, decisions = run(traces, args.method)
        cells = " ".join(f"{1000 * parts.get(p, 0.0) / n:>15.3f}" for p in names)
        print(f"{r:>4} {n:>6} {decisions:>9} {1000 * total / n:>8.3f} {cells}")
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        with profiler:
            run(traces, args.method)
        print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
