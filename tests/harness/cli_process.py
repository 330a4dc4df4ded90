"""``straggler ARGS`` as a process forked from one that imported the CLI once (a forkserver).

A command refused at its options ends in well under a second, but a new Python spends about 3 s
importing the CLI first (XGBoost, SciPy, Faust); forking from a server that holds those modules
keeps each case its own process (its exit status, its stderr, its crash) without the import.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(
    [
        "harness.cli_process",
        "straggler.cli",
        # what `straggler.cli.build_parser` imports, each command's options
        "consumers.cli",
        "consumers.dask_cli",
        "consumers.liveview",
        "pipeline.cli",
        "producers.cli",
        "straggler.kafka.cli",
    ]
)


def _main(argv: list[str], cwd: str, stdout_path: str, stderr_path: str) -> None:
    """In the child: stdout and stderr to these files, then ``straggler.cli.main``."""
    os.chdir(cwd)
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 -- the child's own stream until os._exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    from straggler.cli import main

    try:
        code = main(argv)
    except SystemExit as stop:  # as the interpreter ends on it: None is 0, any other object is printed, 1
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_cli(argv: Sequence[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``straggler *argv`` run in ``cwd``, as `subprocess.run` gives it; fails if it outlives ``timeout``."""
    with tempfile.TemporaryDirectory() as directory:
        stdout, stderr = Path(directory) / "stdout", Path(directory) / "stderr"
        process = _CONTEXT.Process(target=_main, args=(list(argv), str(cwd), str(stdout), str(stderr)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise TimeoutError(f"straggler {' '.join(argv)} still ran after {timeout:.0f} s")
        return subprocess.CompletedProcess(
            ["straggler", *argv], process.exitcode, stdout.read_text(), stderr.read_text()
        )
