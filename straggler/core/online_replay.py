"""A recorded job (`JobTrace`) fed to an `OnlineJob` event by event, as the stream delivers it.

The evaluator (`straggler.evaluation.replay_decisions`) and START's training (the summaries a job shows
online) both drive jobs through it, so both see exactly what the Faust agent sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from straggler.core.jobstate import FloatArray, JobState
from straggler.core.online import Decision, OnlineJob

if TYPE_CHECKING:
    from straggler.traces.jobtrace import JobTrace

IntArray = NDArray[np.int64]


def replay_trace(job: OnlineJob, trace: JobTrace) -> Iterator[list[Decision]]:
    """Feed ``trace`` to ``job`` event by event, as the stream does; yield per-checkpoint verdicts."""
    for _k, t, finished, gone, running, features in trace.checkpoint_events():
        observe_interval(job.state, trace, t, finished, gone, running, features)
        yield job.checkpoint(t)


def observe_interval(
    state: JobState,
    trace: JobTrace,
    t: float,
    finished: IntArray,
    gone: IntArray,
    running: IntArray,
    features: FloatArray,
) -> None:
    """Apply to ``state`` what the stream delivers up to checkpoint ``t`` (one `checkpoint_events`
    step), in the replayer's order: finishes, other ends, then the running tasks' snapshots."""
    ids = trace.task_ids
    for i in finished:  # end - start is `trace.latency`, without building that array every checkpoint
        state.observe_finished(ids[i], trace.finish_features[i], trace.end[i] - trace.start[i], trace.end[i])
    for i in gone:
        state.observe_gone(ids[i], trace.end[i])
    for row, i in enumerate(running):
        state.observe_running(ids[i], features[row], trace.start[i], t)
