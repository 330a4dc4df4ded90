"""Waiting for a consumer group to settle: a worker has joined when its group is stable with members."""

from __future__ import annotations

import time

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from straggler.kafka.config import admin_config


def wait_for_stable_group(
    bootstrap: str, group: str, members: int | None = None, timeout: float = 60.0
) -> float:
    """Wait until ``group`` is stable with ``members`` members (any, if None); the seconds waited.
    Raises TimeoutError naming what was last seen."""
    admin = AdminClient(admin_config(bootstrap))
    began = time.monotonic()
    seen = "no description"
    while time.monotonic() - began < timeout:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
            seen = f"{described.state.name} with {len(described.members)} member(s)"
            enough = len(described.members) == members if members is not None else bool(described.members)
            if described.state == ConsumerGroupState.STABLE and enough:
                return time.monotonic() - began
        except Exception as error:  # the group does not exist yet
            seen = str(error)
        time.sleep(0.5)
    raise TimeoutError(f"consumer group {group!r} not stable with {members or 'any'} member(s): {seen}")
