"""How far can early flags go on a trace? A hindsight flagger run through the evaluator (§10).

The flagger sees what an online method sees at each checkpoint (`CheckpointData`: the running tasks'
latest features and elapsed times, the finished tasks, the online threshold), and one thing no online
method has: an XGBoost classifier trained on the *other* jobs' checkpoints with their true labels
(latency >= the job's true p90; leave one job out). Its rows are every running task not yet over the
threshold at every checkpoint of a replay, as the evaluator feeds them: raw features, features
standardised among the running and against the finished tasks, elapsed / threshold, the elapsed
rank, the finished share, and the Kaplan-Meier P(latency >= threshold | elapsed). At each checkpoint
the flagger flags a task when the classifier's P >= t, and always when elapsed >= threshold (the
reactive rule, which the job driver applies to every classifier). ``budgeted`` variants flag early
only the top tasks by P while the expected count of stragglers still running (10 % of the expected
tasks, less those finished over the threshold and those flagged) is positive.

Every figure is the evaluator's (`straggler.evaluation.evaluate_job` and `summarise`, default
``speculate`` policy), beside the reactive rule run in the same process. Run:

    OMP_NUM_THREADS=1 .venv/bin/python docs/results/hindsight_frontier.py --format synthetic --jobs 40 \
        --seed 0 --out docs/results/nurd-calibrated/hindsight-frontier/frontier.json
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Self

import numpy as np
import xgboost as xgb
from tqdm import tqdm

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.recorded_run import recorded_decisions
from straggler.core.survival import LatencySurvival
from straggler.core.threshold import oracle_threshold
from straggler.evaluation import EvaluationConfig, JobResult, evaluate_job, online_job, summarise
from straggler.traces.loading import add_trace_arguments, load_traces_from_args

THRESHOLDS = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.96, 0.98)
BUDGETED = (0.3, 0.5, 0.7, 0.9)
COMMITTED = Path("docs/results/nurd-calibrated/synthetic-online/summary.json")
"""The committed run whose online methods the figure shows beside the hindsight flagger."""
QUANTILE = 0.9
ROWS_PER_JOB = 12_000
"""Training rows drawn per job (uniformly among its checkpoint rows), so large jobs do not dominate."""


def checkpoint_features(data: CheckpointData) -> FloatArray:
    """One row per running task under evaluation: what the flagger's classifier sees."""
    X = np.asarray(data.X_running, dtype=np.float64)
    elapsed = data.elapsed_running
    with warnings.catch_warnings():  # all-NaN columns: NaN, which XGBoost reads as missing
        warnings.simplefilter("ignore", RuntimeWarning)
        among_running = (X - np.nanmean(X, axis=0)) / (np.nanstd(X, axis=0) + 1e-9)
        finished = np.asarray(data.X_finished, dtype=np.float64)
        against_finished = (X - np.nanmean(finished, axis=0)) / (np.nanstd(finished, axis=0) + 1e-9)
    rank = (np.argsort(np.argsort(elapsed, kind="stable"), kind="stable") + 0.5) / len(elapsed)
    flagged_elapsed = (
        data.at - data.flagged_start
        if data.at is not None and data.flagged_start is not None
        else np.zeros(0)
    )
    survival = LatencySurvival(data.latency_finished, np.concatenate([elapsed, flagged_elapsed]))
    prior = survival.sf(np.full(len(elapsed), data.threshold)) / np.maximum(survival.sf(elapsed), 1e-12)
    columns = [
        elapsed / data.threshold,
        rank,
        np.full(len(elapsed), data.n_finished / max(data.expected_tasks, 1)),
        np.minimum(prior, 1.0),
    ]
    return np.column_stack([X, among_running, against_finished, *columns])


class Recorder(StragglerMethod):
    """Flags nothing itself (the driver's reactive rule does); records each checkpoint's rows."""

    name = "hindsight-recorder"
    predicts_latency = False

    def __init__(self) -> None:
        self.rows_: list[tuple[tuple[str, ...], FloatArray]] = []

    def fit(self, data: CheckpointData) -> Self:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        early = data.elapsed_running < data.threshold
        if early.any():
            ids = tuple(t for t, e in zip(data.running_ids or (), early.tolist(), strict=True) if e)
            self.rows_.append((ids, checkpoint_features(data)[early]))
        return Scores.from_labels(np.zeros(data.n_running, dtype=bool))


class HindsightFlagger(StragglerMethod):
    """Flags a running task when a classifier trained on other jobs' true labels says P >= ``t``."""

    name = "hindsight"
    predicts_latency = False

    def __init__(self, model: xgb.XGBClassifier, t: float, budgeted: bool = False) -> None:
        self.model = model
        self.t = t
        self.budgeted = budgeted

    def fit(self, data: CheckpointData) -> Self:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        p = self.model.predict_proba(checkpoint_features(data))[:, 1]
        flag = p >= self.t
        if self.budgeted:
            known = int(np.sum(data.latency_finished >= data.threshold)) + len(data.flagged_ids)
            room = max(0, math.ceil((1.0 - QUANTILE) * data.expected_tasks) - known)
            early = np.flatnonzero(flag & (data.elapsed_running < data.threshold))
            keep = early[np.argsort(-p[early], kind="stable")][:room]
            flag = np.zeros(len(p), dtype=bool)
            flag[keep] = True
        return Scores.from_labels(np.asarray(flag, dtype=bool), p)


def job_rows(
    trace: JobTrace, config: EvaluationConfig, rng: np.random.Generator
) -> tuple[FloatArray, BoolArray]:
    """A replay's checkpoint rows of ``trace`` (the reactive rule's run), labelled, subsampled."""
    job = online_job(trace, Recorder.name, config, {Recorder.name: Recorder()})
    for _ in recorded_decisions(job, trace):
        pass
    assert isinstance(job.method, Recorder)
    scored, latency = trace.scored, trace.latency
    p90 = oracle_threshold(latency[scored], config.quantile)
    index = {task_id: i for i, task_id in enumerate(trace.task_ids)}
    X, y = [], []
    for ids, rows in job.method.rows_:
        tasks = np.array([index[t] for t in ids])
        known = scored[tasks] & np.isfinite(latency[tasks])
        X.append(rows[known])
        y.append(latency[tasks[known]] >= p90)
    features, labels = np.concatenate(X), np.concatenate(y)
    if len(labels) > ROWS_PER_JOB:
        pick = np.sort(rng.choice(len(labels), ROWS_PER_JOB, replace=False))
        features, labels = features[pick], labels[pick]
    return features, labels


def train_held_out(rows: list[tuple[FloatArray, BoolArray]], held_out: int, seed: int) -> xgb.XGBClassifier:
    """The classifier for job ``held_out``: trained on every other job's labelled rows."""
    X = np.concatenate([r[0] for j, r in enumerate(rows) if j != held_out])
    y = np.concatenate([r[1] for j, r in enumerate(rows) if j != held_out])
    model = xgb.XGBClassifier(
        n_estimators=150, max_depth=5, learning_rate=0.08, subsample=0.8, n_jobs=1, random_state=seed
    )
    return model.fit(X, y)


def method_names() -> list[str]:
    return [f"hindsight-{t}" for t in THRESHOLDS] + [f"hindsight-budgeted-{t}" for t in BUDGETED]


def flaggers(model: xgb.XGBClassifier) -> dict[str, StragglerMethod]:
    out: dict[str, StragglerMethod] = {f"hindsight-{t}": HindsightFlagger(model, t) for t in THRESHOLDS}
    out.update({f"hindsight-budgeted-{t}": HindsightFlagger(model, t, budgeted=True) for t in BUDGETED})
    return out


def _evaluate_one(args: tuple[JobTrace, EvaluationConfig, xgb.XGBClassifier]) -> JobResult:
    trace, config, model = args
    return evaluate_job(trace, config, flaggers(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--committed", type=Path, default=COMMITTED)
    parser.add_argument("--out", type=Path, required=True, help="JSON; the figure is written beside it")
    args = parser.parse_args()
    traces = load_traces_from_args(args)
    config = EvaluationConfig(
        methods=("reactive", *method_names()),
        threshold="online",
        seed=args.seed,
        machine_counts=(),
        policies=("speculate",),
        checkpoint_seconds=args.checkpoint_seconds or 300.0,
    )
    rng = np.random.default_rng(args.seed)
    rows = [job_rows(t, config, rng) for t in tqdm(traces, desc="rows", unit="job")]
    models = [train_held_out(rows, j, args.seed) for j in tqdm(range(len(traces)), desc="fits", unit="job")]
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(
            tqdm(
                pool.map(_evaluate_one, [(t, config, m) for t, m in zip(traces, models, strict=True)]),
                total=len(traces),
                desc="jobs",
                unit="job",
            )
        )
    summary = summarise(results, config)
    table = _table(summary)
    committed = _table(json.loads(args.committed.read_text())) if args.committed.exists() else {}
    bars = issue_bars(summary)
    out: dict[str, Any] = {
        "jobs": len(traces),
        "bars": bars,
        "meets_f1_and_lead": [
            n for n, r in table.items() if r["f1"] >= bars["f1"] and r["lead_time"] >= bars["lead_time"]
        ],
        "meets_all": [n for n, r in table.items() if meets_all(r, bars)],
        "training_rows": int(sum(len(r[1]) for r in rows)),
        "training_straggler_share": float(np.mean(np.concatenate([r[1] for r in rows]))),
        "table": table,
        "committed": {"path": str(args.committed), "table": committed},
        "summary": {k: v for k, v in summary.items() if k != "jct"},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    plot(table, committed, bars, args.out.with_suffix(".png"))
    for name, row in table.items():
        print(f"{name:24s} " + " ".join(f"{k} {v:.4f}" for k, v in row.items()))
    print(json.dumps({k: out[k] for k in ("bars", "meets_f1_and_lead", "meets_all")}, indent=1))


def issue_bars(summary: dict[str, Any]) -> dict[str, float]:
    """Issue 13's bars, from the reactive rule and the limit of the same run."""
    reactive = _table(summary)["reactive"]
    limit = summary["mitigation_limit"]["speculate"]["jct_reduction"]
    return {
        "jct_reduction": reactive["jct_reduction"] + 0.5 * (limit - reactive["jct_reduction"]),
        "extra_machine_time": 1.5 * reactive["extra_machine_time"],
        "f1": reactive["f1"] - 0.02,
        "lead_time": reactive["lead_time"] + 0.10,
        "limit_jct_reduction": limit,
    }


def meets_all(row: dict[str, float], bars: dict[str, float]) -> bool:
    return all(row[k] >= bars[k] for k in ("jct_reduction", "f1", "lead_time")) and (
        row["extra_machine_time"] <= bars["extra_machine_time"]
    )


def plot(
    table: dict[str, dict[str, float]],
    committed: dict[str, dict[str, float]],
    bars: dict[str, float],
    path: Path,
) -> None:
    """F1 (left, zoomed) and JCT reduction (right) against lead time, with the issue's bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    curves = {
        "hindsight, P >= t": [n for n in table if n.startswith("hindsight-") and "budgeted" not in n],
        "hindsight, budgeted": [n for n in table if n.startswith("hindsight-budgeted-")],
    }
    for ax, key in ((left, "f1"), (right, "jct_reduction")):
        for (label, names), style in zip(curves.items(), ("o-", "s--"), strict=True):
            lead = [table[n]["lead_time"] for n in names]
            ax.plot(lead, [table[n][key] for n in names], style, label=label, markersize=4)
            if style == "o-":
                for n, x in zip(names, lead, strict=True):
                    t = n.rsplit("-", 1)[1]
                    ax.annotate(
                        f"t={t}", (x, table[n][key]), fontsize=7, xytext=(3, 3), textcoords="offset points"
                    )
        for name, row in committed.items():
            ax.plot(row["lead_time"], row[key], "k^", markersize=6)
            ax.annotate(
                name, (row["lead_time"], row[key]), fontsize=7, xytext=(3, -9), textcoords="offset points"
            )
        ax.axvline(bars["lead_time"], color="tab:red", lw=1, ls=":")
        ax.axhline(bars[key], color="tab:red", lw=1, ls=":", label="issue 13's bars")
        ax.set_xlabel("lead time (share of a caught straggler's run left at its flag)")
        ax.legend(fontsize=7, loc="lower left" if key == "f1" else "upper left")
    left.set_xlim(0.23, 0.40)
    left.set_ylim(0.84, 0.945)
    left.set_ylabel("F1")
    left.set_title("F1 vs lead time (zoomed; the bars' corner is top right)", fontsize=9)
    right.axhline(bars["limit_jct_reduction"], color="grey", lw=1, ls="--")
    right.set_ylabel("JCT reduction, default speculate policy")
    right.set_title("JCT reduction vs lead time (grey: the limit)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "f1": summary["methods"][name]["f1"],
            "lead_time": summary["methods"][name]["lead_time"],
            "jct_reduction": summary["mitigation"][name]["speculate"]["jct_reduction"],
            "extra_machine_time": summary["mitigation"][name]["speculate"]["extra_machine_time"],
        }
        for name in summary["methods"]
    }


if __name__ == "__main__":
    main()
