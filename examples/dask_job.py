import os
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from distributed import Client, LocalCluster

from producers.dask_job import SpeculativeClient
from straggler.dask_tasks import cancelled

BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
SCHEDULER = os.environ.get("DASK_SCHEDULER_ADDRESS")  # a running cluster's; unset: a LocalCluster here
STUCK = Path(tempfile.mkdtemp()) / "stuck"  # on TMPDIR, which the workers must see too


def square(i: int) -> int:
    if i == 7 and not STUCK.exists():  # task 7's first run gets stuck (a bad disk, say) until stopped
        STUCK.touch()
        while not cancelled():
            time.sleep(0.1)
    time.sleep(1.0)
    return i * i


if __name__ == "__main__":
    with (
        (
            nullcontext(SCHEDULER)
            if SCHEDULER
            else LocalCluster(
                n_workers=3, threads_per_worker=1, scheduler_port=8786, dashboard_address="127.0.0.1:8787"
            )
        ) as cluster,
        Client(cluster) as client,
        SpeculativeClient(client, BROKER) as speculative,
        speculative.job("squares", expected_tasks=8) as job,
    ):
        print(job.gather(job.map(square, range(8))))  # task 7's copy answers, from another worker
