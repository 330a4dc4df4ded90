"""Fit the survival prior's calibration (`PriorCalibration`) across complete synthetic jobs.

    python scripts/fit_prior_calibration.py            # the shipped defaults: seeds 10 and 11
    python scripts/fit_prior_calibration.py --judge google-2011-usage:/tmp/causal60

Prints the coefficients and the log loss of the raw and the calibrated prior on the jobs fitted on;
with ``--judge FORMAT:PATH``, also on that trace (60 s and 300 s checkpoints), with a reliability
table by the job's finished share: the mean probability against the share that straggled. The
shipped `PriorCalibration()` holds what the first command prints: fitted on the repository's
synthetic generator at seeds no evaluation uses, never on an evaluated trace.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from scipy.special import expit
from sklearn.metrics import log_loss

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from straggler.core.arrays import FloatArray  # noqa: E402
from straggler.core.prior_calibration import (  # noqa: E402
    PriorCalibration,
    calibration_from_examples,
    pooled_examples,
)
from straggler.traces.loading import load_traces  # noqa: E402

SHARES = (0.0, 0.25, 0.5, 0.75, 1.01)


def judge(calibration: PriorCalibration, X: FloatArray, y: FloatArray, name: str, table: bool) -> None:
    """Print the log losses on the examples ``X``, ``y`` (`pooled_examples`) and, with ``table``, the
    reliability by finished share."""
    raw = expit(X[:, 0])
    calibrated = calibration.transform(raw, X[:, 1])
    print(
        f"{name}: {len(y)} (running task, checkpoint) pairs, {y.mean():.3f} straggled; log loss of "
        f"the raw prior {log_loss(y, raw):.4f}, calibrated {log_loss(y, calibrated):.4f}"
    )
    if not table:
        return
    print("| finished share | pairs | straggled | mean raw prior | mean calibrated |")
    print("|---|---|---|---|---|")
    for low, high in itertools.pairwise(SHARES):
        rows = (X[:, 1] >= low) & (X[:, 1] < high)
        if rows.any():
            print(
                f"| {low:.2f}–{min(high, 1.0):.2f} | {rows.sum()} | {y[rows].mean():.3f} "
                f"| {raw[rows].mean():.3f} | {calibrated[rows].mean():.3f} |"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="10,11", help="synthetic seeds to fit on (comma-separated)")
    parser.add_argument("--jobs", type=int, default=40, help="jobs per seed")
    parser.add_argument("--judge", action="append", default=[], help="FORMAT:PATH of a trace to judge on")
    args = parser.parse_args(argv)
    spacings = (60.0, 300.0)
    jobs = [
        job
        for seed in (int(s) for s in args.seeds.split(","))
        for spacing in spacings
        for job in load_traces(
            "synthetic", None, checkpoint_seconds=spacing, jobs=args.jobs, seed=seed, progress=False
        )
    ]
    X, y = pooled_examples(jobs)
    calibration = calibration_from_examples(X, y)
    print(
        f"PriorCalibration(intercept={calibration.intercept}, slope={calibration.slope}, "
        f"progress={calibration.progress})"
    )
    judge(calibration, X, y, f"synthetic seeds {args.seeds}", table=False)
    for spec in args.judge:
        fmt, _, path = spec.partition(":")
        for spacing in spacings:
            trace = load_traces(fmt, Path(path), checkpoint_seconds=spacing, progress=False)
            judge(calibration, *pooled_examples(trace), f"{spec} at {spacing:g} s", table=True)


if __name__ == "__main__":
    main()
