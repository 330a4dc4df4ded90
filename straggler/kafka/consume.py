"""Reading what has arrived without waiting out a batch.

``consume(num_messages=n, timeout=t)`` returns only once it has n messages or t has passed, so asking
for a full batch with a timeout holds back every record of a quiet stream by up to t. `arrived` asks
for what is there and blocks only while nothing is.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Message


def arrived(consumer: Consumer, budget: int, timeout: float) -> list[Message]:
    """What has arrived (events such as a partition's end included), up to ``budget``; waits up to
    ``timeout`` seconds only when nothing has."""
    batch = consumer.consume(num_messages=budget, timeout=0)
    if not batch:
        batch = consumer.consume(num_messages=1, timeout=timeout)
        if batch and budget > 1:
            batch += consumer.consume(num_messages=budget - 1, timeout=0)
    return batch
