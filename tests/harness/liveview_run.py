"""Running the live view next to a closed-loop replay, and looking at it with headless Chromium.

Shared by the browser test (tests/test_liveview.py) and the screenshot script
(scripts/liveview_screenshot.py), so both watch the same real pipeline: worker, mitigation consumer and
view as child processes (as compose runs them), the trace replayed in-process with the loop closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

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


UNTIL = """(check, ms = 10000) => new Promise((resolve, reject) => {
  const start = Date.now();
  const look = () => {
    const found = check();
    if (found) resolve(found);
    else if (Date.now() - start > ms) reject(new Error("not there in " + ms + " ms: " + check));
    else setTimeout(look, 50);
  };
  look();
})"""
"""``until(check, ms)``, given to each step of `browse`: resolves with ``check()``'s first truthy value."""


def browse(url: str, steps: Sequence[str], timeout: float = 60.0) -> list[Any]:
    """Open ``url`` in headless Chromium and run each step in the page, in turn, as real user code
    would (clicks dispatch the page's own handlers): a step is the body of an async function of
    ``until`` (see `UNTIL`); returns each step's JSON-able result. Driven over the DevTools protocol."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found: run scripts/setup.sh as root, or apt-get install chromium")
    # Chromium's helper processes can still write to the profile as its main process exits: the whole
    # process group is stopped, and a file written in between does not fail the run.
    with tempfile.TemporaryDirectory(prefix="liveview-browser-", ignore_cleanup_errors=True) as profile:
        process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port = _devtools_port(Path(profile), process, timeout)
            return asyncio.run(asyncio.wait_for(_drive(port, url, steps), timeout))
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop Chromium (SIGTERM, SIGKILL after 10 s), then whatever of its process group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _devtools_port(profile: Path, process: subprocess.Popen[bytes], timeout: float) -> int:
    """The port Chromium chose, from the ``DevToolsActivePort`` file it writes in its profile."""
    deadline = time.monotonic() + timeout
    written = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode}")
        text = written.read_text() if written.exists() else ""
        if re.match(r"\d+\n", text):
            return int(text.split()[0])
        time.sleep(0.05)
    raise TimeoutError(f"chromium opened no DevTools port in {timeout:g} s")


async def _drive(port: int, url: str, steps: Sequence[str]) -> list[Any]:
    ids = itertools.count(1)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:

            async def call(method: str, **params: Any) -> dict[str, Any]:
                call_id = next(ids)
                await ws.send_json({"id": call_id, "method": method, "params": params})
                while True:
                    message = await ws.receive_json()
                    if message.get("id") == call_id:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        result: dict[str, Any] = message["result"]
                        return result

            await call("Page.navigate", url=url)
            results = []
            for step in steps:
                done = await call(
                    "Runtime.evaluate",
                    expression=f"(async (until) => {{ {step} }})({UNTIL})",
                    awaitPromise=True,
                    returnByValue=True,
                )
                if "exceptionDetails" in done:
                    details = done["exceptionDetails"]
                    raise RuntimeError(
                        f"step failed: {details.get('exception', {}).get('description', details)}"
                    )
                results.append(done["result"].get("value"))
            return results


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
