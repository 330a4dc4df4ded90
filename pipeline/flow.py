"""Keeping the input records a worker has already fetched when Faust resumes its flow a second time.

mode's `FlowControlEvent.resume` empties every queue it manages: right after a suspension (a
rebalance), wrong when Faust calls it again at the end of a recovery, because the cleared records are
then neither delivered again nor acknowledged. `keep_queued_records` makes ``resume`` clear the queues
only when the flow was suspended.

The failure this fixes: docs/reliability.md (fix 10), docs/module-notes.md.
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
