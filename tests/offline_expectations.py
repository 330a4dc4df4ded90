"""What the pipeline must decide for given jobs: the offline evaluator's verdicts and commands."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import command_id
from straggler.core.jobtrace import JobTrace
from straggler.core.policies import Unlimited
from straggler.evaluation import EvaluationConfig, method_decisions

Verdict = tuple[str, str, float, bool]
"""(job, task, checkpoint time, is straggler)."""


def offline_nurd(traces: Sequence[JobTrace]) -> tuple[set[Verdict], set[str]]:
    """NURD's verdicts on ``traces`` with the online threshold, and the ids of the commands the
    relaunch-every-flag policy (`Unlimited`) gives them: what the stream must produce."""
    config = EvaluationConfig(methods=("nurd",), threshold="online")
    verdicts: set[Verdict] = set()
    commands: set[str] = set()
    policy = Unlimited()
    for trace in traces:
        for decided in method_decisions(trace, "nurd", config):
            verdicts |= {(d.job_id, d.task_id, d.checkpoint_time, d.is_straggler) for d in decided}
            if decided:
                for action in policy.on_checkpoint(trace.job_id, decided[0].checkpoint_time, decided):
                    commands.add(
                        command_id(action.job_id, action.task_id, action.action, action.decision_key)
                    )
    return verdicts, commands
