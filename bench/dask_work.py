"""The work of `bench/dask_jobs.py`'s jobs, as it runs on the Dask workers (shipped by value; kept
out of the script itself, since a `__main__` pickled by value stops Dask's nannies from restarting
their workers)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SLOWDOWN = 4.0
"""How much longer the slow worker's tasks, and the skewed task, take."""
COMPUTE_SHARE = 0.25
"""Of a task's planned time, the part spent computing (the rest: its input file, then waiting)."""
MB_PER_SECOND = 4
"""A task's input file: this many MB per planned second."""


@dataclass(frozen=True)
class Fault:
    """The scenario's fault as the tasks see it: which task or worker, and a marker file that makes
    a one-time fault happen to the first attempt only."""

    scenario: str
    task: int
    slow_worker: str | None
    marker: str


@dataclass(frozen=True)
class InputFile:
    """A task's input: a file it reads. Dask's ``sizeof`` (what the telemetry reports as the task's
    input) counts the file's bytes, as it would count data passed to the task."""

    path: str
    nbytes: int

    def __sizeof__(self) -> int:
        return self.nbytes


def write_input(directory: str, index: int, seconds: float) -> InputFile:
    """The input of a task planned to take ``seconds``: ``MB_PER_SECOND`` MB per second."""
    path = Path(directory) / f"input-{index}-{uuid.uuid4().hex[:6]}"
    nbytes = int(MB_PER_SECOND * seconds * 2**20)
    path.write_bytes(os.urandom(nbytes))
    return InputFile(str(path), nbytes)


def planned_seconds(tasks: int, seed: int) -> list[float]:
    """Each task's planned time: log-normal around 1 s, within 0.2-5 s."""
    rng = np.random.default_rng(seed)
    return [float(s) for s in np.clip(rng.lognormal(0.0, 0.5, tasks), 0.2, 5.0)]


def run_task(index: int, seconds: float, data: InputFile, fault: Fault | None) -> float:
    """One task: compute, read its input, wait; faults as the scenario says. Returns the seconds it
    ran (runs on a Dask worker; shipped by value)."""
    from distributed import get_worker

    started = time.monotonic()
    if fault is not None and fault.scenario == "slow-worker" and str(get_worker().name) == fault.slow_worker:
        seconds *= SLOWDOWN
    first = False
    if fault is not None and index == fault.task and fault.scenario in ("hung-task", "worker-dies"):
        try:
            Path(fault.marker).touch(exist_ok=False)
            first = True
        except FileExistsError:
            pass
    a = np.random.default_rng(index).random((96, 96))
    while time.monotonic() - started < COMPUTE_SHARE * seconds:
        a = np.tanh(a @ a.T / 96.0)
    Path(data.path).read_bytes()
    if first and fault is not None and fault.scenario == "worker-dies":
        time.sleep(max(seconds / 2 - (time.monotonic() - started), 0.0))
        os._exit(1)  # the worker process dies mid-task
    if first and fault is not None and fault.scenario == "hung-task":
        while True:  # stuck, deaf to cancelled(): only a restart of its worker ends it
            time.sleep(0.5)
    time.sleep(max(seconds - (time.monotonic() - started), 0.0))
    return time.monotonic() - started
