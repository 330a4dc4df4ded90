"""A recorded run: a complete recorded job (`JobTrace`) fed to an `OnlineJob` checkpoint by checkpoint.

The one driver of a recorded job's decisions: the evaluator's (`straggler.evaluation.method_decisions`)
and START's training (`straggler.core.start.training_sequence`). The core may not import the cluster
simulation, so this is the recorded run's view alone: the finishes and other ends of each interval,
then the running tasks' snapshots, in the replayer's order.
`straggler.simulation.JobSimulation` is the one stepping of a cluster that obeys commands; with no
command it shows the same (`tests/test_simulation.py` checks that both give the same decisions).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from straggler.core.jobtrace import JobTrace
from straggler.core.online import Decision, OnlineJob


def recorded_decisions(job: OnlineJob, trace: JobTrace) -> Iterator[list[Decision]]:
    """Feed ``trace`` to ``job`` as the stream delivers it; yield the verdicts of each checkpoint."""
    ids, state = trace.task_ids, job.state
    ended = np.isfinite(trace.end)
    previous = -np.inf
    for k, t in enumerate(trace.checkpoints.tolist()):
        with np.errstate(invalid="ignore"):
            window = ended & (trace.end > previous) & (trace.end <= t)
        previous = t
        for i in _by_end(trace, np.flatnonzero(window & trace.finished)):
            latency = trace.end[i] - trace.start[i]
            state.observe_finished(ids[i], trace.finish_features[i], latency, trace.end[i])
        for i in _by_end(trace, np.flatnonzero(window & ~trace.finished)):
            state.observe_gone(ids[i], trace.end[i])
        for row, i in enumerate(trace.running_index[k].tolist()):
            state.observe_running(ids[i], trace.running_features[k][row], trace.start[i], t)
        yield job.checkpoint(t)


def _by_end(trace: JobTrace, tasks: np.ndarray) -> list[int]:
    """The order the replayer publishes ends in: by end time, stable."""
    return [int(i) for i in tasks[np.argsort(trace.end[tasks], kind="stable")]]
