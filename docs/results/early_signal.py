"""An upper bound on early straggler flags: a classifier trained across jobs, in hindsight.

For each task, the features at the first checkpoint at which it has run between 0.25 and 0.5 of its
job's p90 (standardised within the job's running tasks at that checkpoint), with its elapsed share,
labelled by whether it straggles (latency >= the job's p90). An XGBoost classifier trained on the
*other* jobs' labelled tasks (leave one job out) scores each job. No online method has those labels,
so its precision at a given recall is what early flags can reach at best on this trace. Run:

    .venv/bin/python docs/results/early_signal.py --jobs 40 \
        --out docs/results/nurd-calibrated/early-signal.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import xgboost as xgb
from sklearn.metrics import roc_auc_score

from straggler.core.threshold import oracle_threshold
from straggler.traces.synthetic import generate_jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    jobs = generate_jobs(args.jobs, seed=args.seed)
    rows = []
    for j, trace in enumerate(jobs):
        latency = trace.end - trace.start
        p90 = oracle_threshold(latency, 0.9)
        seen = np.zeros(trace.n_tasks, dtype=bool)
        for t, idx, X in zip(trace.checkpoints, trace.running_index, trace.running_features, strict=True):
            elapsed = t - trace.start[idx]
            pick = ~seen[idx] & (elapsed >= 0.25 * p90) & (elapsed < 0.5 * p90)
            if not pick.any():
                continue
            Z = np.nan_to_num((X - np.nanmean(X, axis=0)) / (np.nanstd(X, axis=0) + 1e-9))
            for i in np.flatnonzero(pick):
                rows.append((j, *Z[i], elapsed[i] / p90, latency[idx[i]] >= p90))
                seen[idx[i]] = True
    table = np.asarray(rows, dtype=np.float64)
    job, X, y = table[:, 0], table[:, 1:-1], table[:, -1]
    score = np.zeros(len(y))
    for j in range(len(jobs)):
        test = job == j
        model = xgb.XGBClassifier(n_estimators=200, max_depth=4, learning_rate=0.05, n_jobs=1)
        score[test] = model.fit(X[~test], y[~test]).predict_proba(X[test])[:, 1]
    order = np.argsort(-score)
    result = {
        "jobs": len(jobs),
        "tasks_scored": len(y),
        "straggler_share": float(y.mean()),
        "auc": float(roc_auc_score(y, score)),
        "top": {
            str(share): {
                "precision": float(y[order[: int(share * len(y))]].mean()),
                "recall": float(y[order[: int(share * len(y))]].sum() / y.sum()),
            }
            for share in (0.01, 0.02, 0.03, 0.05, 0.08)
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
