"""``straggler view``: a web page of the jobs in flight, their stragglers and the commands issued.

The thin shell around `consumers.liveview_state`: a thread reads every pipeline topic from the
beginning (``read_committed``, so aborted commands never show; its own group id, never committed, so
it disturbs no one) and folds each decoded event into the state; an aiohttp server on ``127.0.0.1``
serves the page (``/``, self-contained: no external assets) and the JSON it polls: ``/api/summary``
(totals, figures over ended jobs, the jobs list) and ``/api/job/<id>`` (one job's task table,
quantiles and timeline; query ``sort``, ``order`` asc/desc, ``show``, ``q``, ``limit``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from consumers.cli import add_bootstrap_argument
from consumers.liveview_state import DEFAULT_LIMIT, LiveViewState
from schemas import SchemaError, decode_each
from straggler.argtypes import non_negative_int, port, topic_prefix
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames, ready_line
from straggler.kafka.reachability import (
    add_broker_timeout_argument,
    failure_cause,
    quiet_librdkafka_logger,
    wait_for_broker,
)
from straggler.kafka.topics import missing_line
from straggler.ports import listening_socket

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("liveview.html")
POLL_TIMEOUT_S = 0.5
"""Longest a consume call blocks, so a stop is noticed within about this."""
TOPIC_RETRY_S = 2.0
"""How often to look again for topics that do not exist yet."""
NO_STORE = {"Cache-Control": "no-store"}


class TopicReader:
    """Folds every record of the pipeline's topics into a `LiveViewState`, on a thread of its own."""

    def __init__(self, bootstrap: str, topics: TopicNames, state: LiveViewState) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.state = state
        self.lock = threading.Lock()
        self.records = 0
        self.assigned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveview-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def summary(self) -> dict[str, Any]:
        """The state's summary, plus how far the reader has got (taken under the lock)."""
        with self.lock:
            out = self.state.summary()
            out["reader"] = {"records": self.records, "assigned": self.assigned}
        out["generated_at"] = time.time()
        return out

    def job_detail(self, job_id: str, **query: Any) -> dict[str, Any] | None:
        """`LiveViewState.job_detail` under the lock; None for a job the view does not keep."""
        with self.lock:
            out = self.state.job_detail(job_id, **query)
        if out is not None:
            out["generated_at"] = time.time()
        return out

    def _run(self) -> None:
        group = f"straggler-view-{uuid.uuid4().hex[:8]}"
        # a broker gone: its connection failures once every few minutes, not several a second
        consumer = Consumer({**consumer_config(self.bootstrap, group), "logger": quiet_librdkafka_logger()})
        try:
            if not self._assign(consumer):
                return
            while not self._stop.is_set():
                messages = consumer.consume(num_messages=1000, timeout=POLL_TIMEOUT_S)
                with self.lock:
                    for message in messages:
                        if message.error() is not None:
                            continue
                        self.records += 1
                        try:
                            self.state.apply_all(decode_each(message.value()))
                        except SchemaError:
                            self.state.undecodable += 1
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> bool:
        """Wait until every topic exists, then read all their partitions from the beginning (while the
        broker does not answer too: the page keeps serving what it has, the reader says so once)."""
        silent = False
        said: list[str] = []
        while not self._stop.is_set():
            try:
                listed = consumer.list_topics(timeout=10.0).topics
            except KafkaException as exc:
                if not silent:
                    log.warning(
                        "no answer from the broker at %s (%s); retrying",
                        self.bootstrap,
                        failure_cause([str(exc.args[0])]),
                    )
                    silent = True
                self._stop.wait(TOPIC_RETRY_S)
                continue
            missing = [t for t in self.topics.all() if t not in listed or not listed[t].partitions]
            if not missing:
                consumer.assign(
                    [
                        TopicPartition(topic, p, OFFSET_BEGINNING)
                        for topic in self.topics.all()
                        for p in sorted(listed[topic].partitions)
                    ]
                )
                self.assigned = True
                partitions = sum(len(listed[topic].partitions) for topic in self.topics.all())
                log.info(ready_line("view", self.bootstrap, self.topics.all(), [], partitions))
                return True
            if missing != said:  # once (again only if another set goes missing)
                log.warning(missing_line("view", self.bootstrap, missing, self.topics.prefix))
                said = missing
            self._stop.wait(TOPIC_RETRY_S)
        return False


def make_app(reader: TopicReader) -> web.Application:
    """The page and its JSON endpoint."""
    page = PAGE.read_text()

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def summary(request: web.Request) -> web.Response:
        return web.json_response(reader.summary(), headers=NO_STORE)

    async def job(request: web.Request) -> web.Response:
        q = request.query
        try:
            detail = reader.job_detail(
                request.match_info["job_id"],
                sort=q.get("sort", "elapsed"),
                descending=q.get("order", "desc") != "asc",
                show=q.get("show", "all"),
                search=q.get("q", ""),
                limit=int(q.get("limit", DEFAULT_LIMIT)),
            )
        except ValueError as error:
            return web.json_response({"error": str(error)}, status=400, headers=NO_STORE)
        if detail is None:
            return web.json_response({"error": "no such job"}, status=404, headers=NO_STORE)
        return web.json_response(detail, headers=NO_STORE)

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/job/{job_id}", job)
    return app


async def serve(reader: TopicReader, listening: socket.socket) -> None:
    """Serve on ``listening`` (see `straggler.ports.listening_socket`) until SIGTERM or SIGINT."""
    runner = web.AppRunner(make_app(reader), access_log=None)
    await runner.setup()
    await web.SockSite(runner, listening).start()
    host, port = listening.getsockname()[:2]
    log.info("live view on http://%s:%d/", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``view`` command to the top-level CLI."""
    p = subparsers.add_parser("view", help="a live web page of jobs, stragglers and commands")
    add_bootstrap_argument(p)
    p.add_argument("--topic-prefix", type=topic_prefix, default="", help="prefix of every topic name")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port, default=8080, help="port to listen on")
    p.add_argument(
        "--keep-ended",
        type=non_negative_int,
        default=200,
        help="ended jobs shown in detail (older ones: totals only)",
    )
    add_broker_timeout_argument(p)
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    # the port first: taken, it ends the command in one line (exit 2) whether or not a broker answers
    with listening_socket(args.host, args.port, "--port") as listening:
        wait_for_broker(args.bootstrap, args.broker_timeout)  # else the page would serve an empty view
        reader = TopicReader(args.bootstrap, TopicNames(args.topic_prefix), LiveViewState(args.keep_ended))
        reader.start()
        try:
            asyncio.run(serve(reader, listening))
        finally:
            reader.stop()
    return 0
