"""How much a running task's early features say about its latency, within a job: a trace's hardness.

Per job and feature, Spearman's rank correlation between a task's features at the first checkpoint
at which it runs with that feature reported (what an online method sees first) and its latency; then,
per feature, the median over jobs of |rho|, and per job the best feature's |rho|. The same numbers for
any ``--format``, so a generated trace can be read beside the real one. Run from the repository root:

    .venv/bin/python docs/results/feature_rank.py --format synthetic --jobs 40 --out F.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from straggler.core.jobtrace import JobTrace
from straggler.traces.loading import add_trace_arguments, load_traces_from_args


def first_look(trace: JobTrace) -> np.ndarray:
    """(n_tasks, n_features): each feature as first reported at a checkpoint while the task ran."""
    seen = np.full((trace.n_tasks, len(trace.feature_names)), np.nan)
    for idx, X in zip(trace.running_index, trace.running_features, strict=True):
        fresh = np.isnan(seen[idx]) & ~np.isnan(X)
        block = seen[idx]
        block[fresh] = X[fresh]
        seen[idx] = block
    return seen


def job_correlations(trace: JobTrace) -> dict[str, float]:
    X, latency, scored = first_look(trace), trace.latency, trace.scored
    out: dict[str, float] = {}
    for j, name in enumerate(trace.feature_names):
        ok = scored & ~np.isnan(X[:, j])
        if ok.sum() < 20 or np.ptp(X[ok, j]) == 0:
            continue
        rho = spearmanr(X[ok, j], latency[ok]).statistic
        if np.isfinite(rho):
            out[name] = float(rho)
    return out


def summarise(traces: list[JobTrace]) -> dict[str, Any]:
    per_job = [job_correlations(t) for t in traces]
    names = sorted({n for job in per_job for n in job})
    best = np.array([max((abs(v) for v in job.values()), default=0.0) for job in per_job])
    return {
        "jobs": len(traces),
        "tasks": int(sum(t.n_tasks for t in traces)),
        "median_abs_rho": {n: float(np.median([abs(j[n]) for j in per_job if n in j])) for n in names},
        "best_feature_abs_rho": {q: float(np.quantile(best, float(q))) for q in ("0.1", "0.5", "0.9")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    summary = summarise(load_traces_from_args(args))
    summary["command"] = "docs/results/feature_rank.py " + " ".join(
        f"{k} {v}" for k, v in vars(args).items() if v is not None and k != "out"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
