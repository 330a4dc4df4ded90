"""START's MAPE on the straggler count, cross-fitted on the evaluator's folds.

For every job, the START model trained on the other folds' jobs (`train_population_methods`, the
same folds as ``straggler evaluate``) is replayed through the evaluator's driver with the online
threshold; after each prediction checkpoint we read its predicted count E_S. The prediction at
normalised time tau is the last one made at or before ``first start + tau * (last end - first start)``.

Predicted: E_S (real, not floored). Actual, three definitions (all over the job's scored tasks):
- ``pareto``: tasks whose latency exceeds K = 1.5 * mean of the job's own complete Pareto fit, the
  paper's straggler (jobs with alpha <= 1 have no finite K and 0 such stragglers);
- ``p90``: tasks at or above the job's p90 latency, the stragglers our F1 counts;
- ``mle_es``: E_S of the job's own complete Pareto fit (the network's target, Eq. 4).
MAPE = mean over jobs with actual > 0 of |actual - predicted| / actual, in %.

Two reference predictors use the same checkpoints: ``finished-fit`` (E_S of a Pareto fit of the
latencies finished so far, no network) and ``train-share`` (q times the mean share of ``pareto``
stragglers in the training folds' jobs).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python docs/results/start/start_mape.py \
        --format google-2011 --trace ../shared/traces/google-2011 --checkpoint-seconds 300 \
        --out docs/results/start/mape-google-300s.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from straggler.core.method import CheckpointData, Scores
from straggler.core.start import StartMethod, actual_stragglers, expected_stragglers, fit_pareto
from straggler.core.threshold import oracle_threshold
from straggler.evaluation import EvaluationConfig, method_decisions, population_fold, train_population_methods
from straggler.traces.loading import add_trace_arguments, load_traces_from_args

TAUS = (0.25, 0.5, 0.75)


class Recorder(StartMethod):
    """START that the driver uses in place (no per-job copy), recording each prediction."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Recorder:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        scores = super().predict(data)
        finished = np.asarray(data.latency_finished)
        fit = expected_stragglers(fit_pareto(finished)[0], data.expected_tasks) if len(finished) >= 2 else 0.0
        self.log_ = [*getattr(self, "log_", []), (float(data.at or 0.0), self.expected_stragglers_, fit)]
        return scores


def mape(actual: np.ndarray, predicted: np.ndarray) -> tuple[float, int]:
    ok = actual > 0
    if not ok.any():
        return math.nan, 0
    return float(100.0 * np.mean(np.abs(actual[ok] - predicted[ok]) / actual[ok])), int(ok.sum())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_trace_arguments(parser)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    traces = load_traces_from_args(args, progress=False)
    config = EvaluationConfig(methods=("start",), threshold="online", seed=args.seed)

    started = time.perf_counter()
    prototypes = train_population_methods(traces, config)
    training_wall = time.perf_counter() - started
    folds = [population_fold(t.job_id, config.population_folds) for t in traces]
    fold_info = {}
    for f, p in zip(folds, prototypes, strict=True):
        m = p["start"]
        assert isinstance(m, StartMethod)
        fold_info[f] = {
            "train_seconds": m.train_seconds_,
            "training_jobs": m.training_jobs_,
            "best_epoch": m.best_epoch_,
            "epochs_run": len(m.history_),
        }
    share = {}  # per fold: mean share of pareto stragglers among the training folds' jobs
    for k in set(folds):
        shares = [
            actual_stragglers(t.latency[t.scored]) / t.expected_tasks
            for t, f in zip(traces, folds, strict=True)
            if f != k
        ]
        share[k] = float(np.mean(shares))

    rows: dict[str, dict[str, list[float]]] = {}
    per_checkpoint: dict[str, list[float]] = {
        "start": [],
        "pareto": [],
        "p90": [],
        "mle_es": [],
        "finished-fit": [],
    }
    no_prediction = 0
    for trace, proto, fold in zip(traces, prototypes, folds, strict=True):
        start = proto["start"]
        spy = Recorder(**start.get_params())
        spy.__dict__.update({k: v for k, v in vars(start).items() if k.endswith("_")})
        for _ in method_decisions(trace, "start", config, {"start": spy}):
            pass
        log = np.array(getattr(spy, "log_", []), dtype=np.float64).reshape(-1, 3)
        latency = trace.latency[trace.scored]
        alpha, _ = fit_pareto(latency)
        actual = {
            "pareto": float(actual_stragglers(latency)),
            "p90": float(np.sum(latency >= oracle_threshold(latency, config.quantile))),
            "mle_es": expected_stragglers(alpha, trace.expected_tasks),
        }
        if len(log) == 0:
            no_prediction += 1
            continue
        for name, value in actual.items():
            per_checkpoint[name] += [value] * len(log)
        per_checkpoint["start"] += log[:, 1].tolist()
        per_checkpoint["finished-fit"] += log[:, 2].tolist()
        t0 = float(np.nanmin(trace.start[trace.scored]))
        t1 = float(np.nanmax(trace.end[trace.scored]))
        for tau in TAUS:
            made = log[:, 0] <= t0 + tau * (t1 - t0)
            if not made.any():
                continue
            last = log[made][-1]
            row = rows.setdefault(str(tau), {})
            for name, value in actual.items():
                row.setdefault(name, []).append(value)
            row.setdefault("start", []).append(last[1])
            row.setdefault("finished-fit", []).append(last[2])
            row.setdefault("train-share", []).append(share[fold] * trace.expected_tasks)

    out: dict[str, Any] = {
        "format": args.format,
        "jobs": len(traces),
        "jobs_never_predicted": no_prediction,
        "cross_fit_training_wall_seconds": training_wall,
        "folds": {str(k): v for k, v in sorted(fold_info.items())},
        "mape": {},
    }
    print(f"{args.format}: {len(traces)} jobs, {no_prediction} never reach a prediction checkpoint")
    print("| time | actual | jobs | START | finished-fit | train-share | mean actual | mean START E_S |")
    print("|---|---|---|---|---|---|---|---|")
    for tau, row in rows.items():
        for definition in ("pareto", "p90", "mle_es"):
            actual_arr = np.array(row[definition])
            entry = {"mean_actual": float(actual_arr.mean()), "mean_start": float(np.mean(row["start"]))}
            for predictor in ("start", "finished-fit", "train-share"):
                entry[predictor], entry["jobs"] = mape(actual_arr, np.array(row[predictor]))
            out["mape"].setdefault(tau, {})[definition] = entry
            print(
                f"| {float(tau):.0%} | {definition} | {entry['jobs']} | {entry['start']:.1f} | "
                f"{entry['finished-fit']:.1f} | {entry['train-share']:.1f} | {entry['mean_actual']:.1f} | "
                f"{entry['mean_start']:.1f} |"
            )
    for definition in ("pareto", "p90", "mle_es"):
        actual_arr = np.array(per_checkpoint[definition])
        entry = {}
        for predictor in ("start", "finished-fit"):
            entry[predictor], entry["checkpoints"] = mape(actual_arr, np.array(per_checkpoint[predictor]))
        out["mape"].setdefault("all_checkpoints", {})[definition] = entry
        print(
            f"| all checkpoints | {definition} | {entry['checkpoints']} ckpts | {entry['start']:.1f} | "
            f"{entry['finished-fit']:.1f} | - | | |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
