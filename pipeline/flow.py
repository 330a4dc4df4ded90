"""Keeping the input records a worker has already fetched when Faust resumes its flow a second time.

mode's `FlowControlEvent.resume` empties every queue it manages, Faust's agent channels included:
resuming after a suspension (a rebalance) should drop what was fetched for partitions that may
have moved. But Faust also calls ``resume`` at the end of every recovery, when the flow is already
running. By then the fetcher has read the stream partitions, queued records for the agent and
moved its read offset past them:

- the cleared records are never delivered again (Faust drops re-fetched offsets below its read
  offset);
- they are never acknowledged, so the partition's committed offset stops at the first of them.

The next restart then reads them long after the records that followed them. Seen in repeated
SIGKILL runs (`bench/fault_scenarios.py`, ``worker-kill-repeated``): a finished task's event was
cleared while the agent fitted a model, and the job was evaluated as if that task still ran (11 of
99 runs with four kills each, before this fix; docs/reliability.md, fix 10).

`keep_queued_records` makes ``resume`` clear the queues only when the flow was suspended. A
suspension is what makes queued records stale, and Faust always suspends before a rebalance.
"""

from __future__ import annotations

from typing import Protocol


class FlowControl(Protocol):
    """What `keep_queued_records` needs of mode's `FlowControlEvent`."""

    def is_active(self) -> bool: ...

    def resume(self) -> None: ...


def keep_queued_records(flow_control: FlowControl) -> None:
    """Make ``flow_control.resume()`` a no-op while the flow is active (it would clear the queues)."""
    resume = flow_control.resume

    def resume_if_suspended() -> None:
        if not flow_control.is_active():
            resume()

    flow_control.resume = resume_if_suspended  # type: ignore[method-assign]
