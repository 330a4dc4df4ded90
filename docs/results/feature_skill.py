"""What a feature group is worth to NURD's latency regressor, measured directly and in hindsight.

Per job, the regressor NURD uses (XGBoost on log latency, same settings as `straggler.core.nurd.Nurd`)
is scored by 3-fold out-of-fold R^2 on *all* of the job's finished tasks, with each task's features
as of its finish time. This is an upper bound on the signal, not an online result: the online model
only ever sees the tasks that finished first (no stragglers) and features as of a checkpoint. R^2 is
clipped at 0 per job (a regressor worse than the mean is as good as none), as NURD's gate does.
Run from the repository root:

    .venv/bin/python docs/results/feature_skill.py --format google-2011 --trace DIR --max-jobs 150 --out F
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb
from sklearn.model_selection import KFold

from straggler.traces.loading import add_trace_arguments, load_traces_from_args
from straggler.traces.synthetic import USAGE_FEATURES

GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "google-2011": {
        "machine context": (
            "machine_running_tasks",
            "machine_same_job_tasks",
            "machine_failures_1h",
            "machine_slowness",
            "machine_history",
        ),
        "own history": ("own_evictions", "own_failures"),
        "schedule_delay": ("schedule_delay",),
    },
    "synthetic": {
        "cpi": ("cpi",),
        "machine_load": ("machine_load",),
        "all usage (events only left)": USAGE_FEATURES,
    },
}


def out_of_fold_r2(X: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """3-fold out-of-fold R^2 of NURD's regressor, clipped to [0, 1]."""
    if len(y) < 9 or float(np.var(y)) <= 1e-12 or X.shape[1] == 0:
        return 0.0
    oof = np.empty(len(y))
    for train, test in KFold(3, shuffle=True, random_state=seed).split(X):
        model = xgb.XGBRegressor(
            n_estimators=60, max_depth=4, learning_rate=0.1, tree_method="hist", n_jobs=1, random_state=seed
        )
        oof[test] = model.fit(X[train], y[train]).predict(X[test])
    return float(np.clip(1.0 - np.mean((y - oof) ** 2) / np.var(y), 0.0, 1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_trace_arguments(parser)
    parser.set_defaults(jobs=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.format not in GROUPS:
        parser.error(f"--format: one of {', '.join(sorted(GROUPS))}")
    traces = load_traces_from_args(args, progress=False)
    variants: dict[str, tuple[str, ...]] = {"all features": ()}
    variants.update({f"without {name}": cols for name, cols in GROUPS[args.format].items()})
    scores: dict[str, list[float]] = {name: [] for name in variants}
    for trace in traces:
        ok = trace.scored
        y = np.log(np.maximum(trace.latency[ok], 1e-3))
        for name, dropped in variants.items():
            keep = [i for i, f in enumerate(trace.feature_names) if f not in dropped]
            scores[name].append(out_of_fold_r2(trace.finish_features[ok][:, keep], y, args.seed))
    out: dict[str, Any] = {
        "format": args.format,
        "jobs": len(traces),
        "max_jobs": args.max_jobs,
        "r2_out_of_fold": {
            name: {
                "mean": float(np.mean(v)),
                "median": float(np.median(v)),
                "share_of_jobs_above_0.1": float(np.mean(np.array(v) > 0.1)),
            }
            for name, v in scores.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
