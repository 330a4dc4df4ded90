"""The Dask adapter publishes its task records in batches, off the submitting thread
(`producers.dask_job.RecordPublisher`), on a real in-process `LocalCluster`: every record handed over
is published once flushed, and those handed over while a publication is on its way go together in
the next call, not one call each (a scheduler round trip per task delayed a job's last submit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from distributed import Client, LocalCluster

from producers.dask_job import RecordPublisher


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
        ) as local,
        Client(local, set_as_default=False) as dask_client,
    ):
        yield dask_client


class CountingClient:
    """The real client, with its ``publish_dataset`` calls counted; the first one waits for ``go``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls: list[int] = []
        self.first_call = threading.Event()
        self.go = threading.Event()

    def publish_dataset(self, **datasets: Any) -> None:
        self.calls.append(len(datasets))
        self.first_call.set()
        assert self.go.wait(30.0)
        self.client.publish_dataset(**datasets)


def test_every_record_handed_over_is_published_once_flushed(client: Client) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        records = RecordPublisher(client, pool)
        for i in range(60):
            records.publish(f"flushed-{i}", {"task": i})
        records.flush()
    assert all(client.get_dataset(f"flushed-{i}") == {"task": i} for i in range(60))


def test_records_handed_over_during_a_publication_go_together_in_the_next_call(client: Client) -> None:
    counting = CountingClient(client)
    with ThreadPoolExecutor(max_workers=1) as pool:
        records = RecordPublisher(counting, pool)  # type: ignore[arg-type]
        records.publish("batched-0", 0)
        assert counting.first_call.wait(30.0)
        for i in range(1, 50):  # while the first call is on its way
            records.publish(f"batched-{i}", i)
        counting.go.set()
        records.flush()
    assert counting.calls == [1, 49]
    assert set(client.list_datasets()) >= {f"batched-{i}" for i in range(50)}
