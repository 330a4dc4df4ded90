"""Faust's second resume at the end of a recovery must not drop the records already queued (fix 10).

These use mode's real `FlowControlEvent` and `FlowControlQueue`, the objects Faust's agent channels
are built on, so the first test fails if mode stops clearing queues on resume (then the guard in
`pipeline.flow` would have nothing left to do).
"""

from __future__ import annotations

from mode.utils.queues import FlowControlEvent, FlowControlQueue

from pipeline.flow import keep_queued_records


def _running_flow(guarded: bool) -> tuple[FlowControlEvent, FlowControlQueue[str]]:
    flow = FlowControlEvent(initially_suspended=True)
    queue: FlowControlQueue[str] = FlowControlQueue(flow_control=flow, clear_on_resume=True)
    if guarded:
        keep_queued_records(flow)
    flow.resume()  # recovery starts the flow to read the changelogs
    queue.put_nowait("offset 551")  # the fetcher queues a stream record for the agent
    return flow, queue


def test_unguarded_a_second_resume_drops_the_queued_records() -> None:
    flow, queue = _running_flow(guarded=False)
    flow.resume()  # Faust's resume at the end of the recovery
    assert queue.empty(), "mode no longer clears on resume: pipeline.flow may be unnecessary"


def test_guarded_a_second_resume_keeps_the_queued_records() -> None:
    flow, queue = _running_flow(guarded=True)
    flow.resume()
    assert flow.is_active()
    assert queue.get_nowait() == "offset 551"


def test_guarded_a_resume_after_a_suspension_still_clears_stale_records() -> None:
    flow, queue = _running_flow(guarded=True)
    flow.suspend()  # a rebalance: what was queued may belong to partitions that moved
    assert not flow.is_active()
    flow.resume()
    assert flow.is_active()
    assert queue.empty()
