"""Running the live view next to a closed-loop replay, and looking at it with headless Chromium.

Shared by the browser test (tests/test_liveview.py) and the screenshot script
(scripts/liveview_screenshot.py), so both watch the same real pipeline: worker, mitigation consumer and
view as child processes (as compose runs them), the trace replayed in-process with the loop closed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from producers.replayer import ReplayResult, TraceReplayer
from straggler.core.jobtrace import JobTrace
from straggler.kafka.names import TopicNames
from straggler.replay import child_process, pipeline_processes

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The headless browser's path (Debian's ``chromium`` package), or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser(args: Sequence[str], timeout: float) -> str:
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found: run scripts/setup.sh as root, or apt-get install chromium")
    done = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return done.stdout


def dump_dom(url: str, budget_ms: int = 5000, timeout: float = 60.0) -> str:
    """The page's DOM after its scripts ran for ``budget_ms`` of virtual time."""
    return _browser([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)


def screenshot(url: str, path: Path, size: str = "1280,800", budget_ms: int = 5000) -> None:
    """A PNG of the page as rendered after ``budget_ms`` of virtual time."""
    _browser(
        [
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={path.resolve()}",
            f"--window-size={size}",
            url,
        ],
        60.0,
    )


def summary(port: int) -> dict[str, Any] | None:
    """The view's ``/api/summary``, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/summary", timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def wait_for(port: int, ready: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    """Poll the view until ``ready(summary)``; raise TimeoutError with the last summary otherwise."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = summary(port)
        if last is not None and ready(last):
            return last
        time.sleep(0.3)
    raise TimeoutError(f"the live view did not get there in {timeout:g} s; last summary: {last}")


@contextmanager
def pipeline_and_view(
    bootstrap: str,
    topics: TopicNames,
    workdir: Path,
    port: int,
    *,
    policy: str = "speculate",
    checkpoint_seconds: float = 300.0,
    seed: int = 0,
) -> Iterator[str]:
    """Worker, mitigation consumer and view on existing topics; yields the mitigation group."""
    group = f"{topics.prefix}mitigation"
    common = ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix]
    with ExitStack() as stack:
        stack.enter_context(
            pipeline_processes(
                bootstrap,
                topics,
                group,
                policy=policy,
                seed=seed,
                checkpoint_seconds=checkpoint_seconds,
                datadir=workdir / "faust",
                logs=workdir,
            )
        )
        stack.enter_context(child_process(["view", *common, "--port", str(port)], workdir / "view.log"))
        wait_for(port, lambda s: bool(s["reader"]["assigned"]), 60.0)
        yield group


def replay(
    traces: Sequence[JobTrace],
    bootstrap: str,
    topics: TopicNames,
    group: str,
    *,
    checkpoint_seconds: float,
    speed: float = 0.0,
    seed: int = 0,
) -> ReplayResult:
    """The closed-loop replay of ``traces`` through the running pipeline."""
    return TraceReplayer(
        traces,
        bootstrap,
        topics=topics,
        speed=speed,
        closed_loop=True,
        seed=seed,
        mitigator_group=group,
        progress=False,
        checkpoint_seconds=checkpoint_seconds,
    ).run()
