"""How often `nurd-calibrated`'s per-job calibrator acts, and how well its probability ranks there.

On the synthetic set (seed 0, 60 s checkpoints, online threshold): the checkpoints of the first
``--jobs`` jobs at which ``nurd-calibrated`` (the ``nurd`` shipped before `SurvivalGate`) has a
calibrator, and at those with both classes among at least 20 running tasks, the mean ROC AUC of the
straggle probability and of elapsed time (which orders the survival prior) against each task's true
label (latency >= the job's p90).

.venv/bin/python docs/results/nurd_calibrator_reach.py [--jobs 20]
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.metrics import roc_auc_score

from straggler.core.recorded_run import recorded_decisions
from straggler.core.threshold import oracle_threshold
from straggler.evaluation import EvaluationConfig, online_job
from straggler.traces.loading import load_traces


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    traces = load_traces("synthetic", None, jobs=40, seed=0, checkpoint_seconds=60.0, progress=False)
    config = EvaluationConfig(methods=("nurd-calibrated",), threshold="online")
    checkpoints = acting = 0
    auc_probability: list[float] = []
    auc_elapsed: list[float] = []
    for trace in traces[: args.jobs]:
        job = online_job(trace, "nurd-calibrated", config)
        threshold = oracle_threshold(trace.latency[trace.scored], config.quantile)
        truth = dict(zip(trace.task_ids, (trace.latency >= threshold).tolist(), strict=True))
        for verdicts in recorded_decisions(job, trace):
            checkpoints += 1
            if getattr(getattr(job.method, "gate_", None), "calibrator_", None) is None:
                continue
            acting += 1
            y = np.array([truth[d.task_id] for d in verdicts])
            if len(verdicts) < 20 or y.all() or not y.any():
                continue
            auc_probability.append(roc_auc_score(y, [d.straggle_probability for d in verdicts]))
            auc_elapsed.append(roc_auc_score(y, [d.elapsed for d in verdicts]))
    print(f"jobs {args.jobs}: checkpoints {checkpoints}, calibrator acting at {acting}")
    print(
        f"ROC AUC over {len(auc_probability)} checkpoints: straggle probability "
        f"{np.mean(auc_probability):.3f}, elapsed time {np.mean(auc_elapsed):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
