"""README "On a Dask cluster": its Python block, as it stands there, runs against an embedded broker
with the worker, the mitigator and the Dask executor started as its shell block starts them; the
stuck task is copied by the whole pipeline and the job prints every result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from straggler.kafka.embedded import embedded_kafka
from straggler.kafka.topics import create_topics

# a broker of its own: the block uses the default topics
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.scenario]

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 150.0


def readme_python_block(section: str = "## On a Dask cluster") -> str:
    """The first ```python block of the README's ``section``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(section + "\n")
    block = re.search(r"^```python\n(.*?)^```$", text[start:], re.S | re.M)
    assert block is not None, f"no python block under {section!r}"
    return block.group(1)


@contextmanager
def stage(log: Path, *argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``straggler`` command in the background, its output in ``log``; stopped on leaving."""
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "straggler.cli", *argv], stdout=out, stderr=out)
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def test_the_readme_block_is_the_example_file() -> None:
    assert readme_python_block() == (ROOT / "examples" / "dask_job.py").read_text()


def test_the_readme_dask_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "dask_job.py"
    script.write_text(readme_python_block())
    with embedded_kafka() as bootstrap, ExitStack() as stages:
        create_topics(bootstrap)
        # the README's shell block, on this broker
        stages.enter_context(
            stage(
                tmp_path / "worker.log",
                *(
                    "worker",
                    "--bootstrap",
                    bootstrap,
                    "--datadir",
                    str(tmp_path / "w"),
                ),
            )
        )
        stages.enter_context(stage(tmp_path / "mitigator.log", "mitigate", "--bootstrap", bootstrap))
        executor_log = tmp_path / "executor.log"
        stages.enter_context(
            stage(executor_log, "dask-executor", "--bootstrap", bootstrap, "--scheduler", "127.0.0.1:8786")
        )
        job = subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
        executed = executor_log.read_text()
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.strip().splitlines()[-1] == str([i * i for i in range(8)])
    assert (
        "applied duplicate of job squares task 7 attempt 0 (attempt 1 started on another worker)" in executed
    )
