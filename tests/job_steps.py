"""An `OnlineJob` fed a recorded job checkpoint by checkpoint, for tests that watch its fits."""

from __future__ import annotations

from collections.abc import Iterator

from straggler.core.jobtrace import JobTrace
from straggler.core.online import Decision, OnlineJob
from straggler.simulation import JobSimulation, observe_step, steps


def each_checkpoint(job: OnlineJob, trace: JobTrace) -> Iterator[tuple[list[Decision], bool]]:
    """Step ``trace`` through a `JobSimulation` that receives no command, as the stream shows it to
    ``job``; yield each checkpoint's decisions and whether that checkpoint refitted the model."""
    sim = JobSimulation(trace, seed=0)
    for step in steps(sim, None):
        observe_step(job.state, sim, step)
        version = job.model_version
        decisions = job.checkpoint(step.at)
        yield decisions, job.model_version != version
