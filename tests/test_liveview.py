"""`straggler view` in a real browser: a closed-loop replay through a real broker, the page rendered by
headless Chromium, and what it shows compared with what the topics carried and with the replay's
summary.json of the same run."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.liveview_run import browse, chromium, dump_dom, pipeline_and_view, wait_for
from harness.small_jobs import make_job

from schemas import (
    JobEvent,
    MitigationNote,
    Prediction,
    RelaunchCommand,
    SchemaError,
    TaskCheckpoint,
    decode_each,
)
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import closed_loop_replay, read_outputs, read_topic, replay_summary

pytestmark = [pytest.mark.broker, pytest.mark.scenario]  # headless Chromium on a replay

INTERVAL = 4.0
"""The replay's checkpoint spacing, seconds."""
ROWS = 50
"""Task rows and timeline lanes the page asks for."""
VOID = {"meta", "input", "br", "img", "link", "hr", "wbr", "col", "source"}
CLICK = """const settled = () => document.body.dataset.rendered === location.search;
const click = async (selector, expect) => {
  document.querySelector(selector).click();
  await until(() => location.search.includes(expect) && settled());
};
"""
"""Prefix of the steps `browse` runs: ``click`` clicks an element, then waits until the URL has
``expect`` and the page has rendered what that URL asks for."""
DOM = "return document.documentElement.outerHTML;"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    children: list[_Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[_Node]:
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, match: Callable[[_Node], bool]) -> list[_Node]:
        return [node for node in self.walk() if match(node)]

    def by_id(self, node_id: str) -> _Node:
        (found,) = self.find(lambda n: n.attrs.get("id") == node_id)
        return found

    def all_text(self) -> str:
        return "".join(self.text) + "".join(child.all_text() for child in self.children)


class _Tree(HTMLParser):
    """The dumped DOM as a tree (enough of HTML for Chromium's serialisation)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.root = _Node("#root", {})
        self._stack = [self.root]
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = _Node(tag, {k: v or "" for k, v in attrs})
        self._stack[-1].children.append(node)
        if tag not in VOID:
            self._stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self._stack) - 1, 0, -1):
            if self._stack[depth].tag == tag:
                del self._stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._stack[-1].text.append(data)


def _page(port: int, query: str = "") -> _Node:
    """The page at ``/QUERY`` as ``chromium --dump-dom`` shows it."""
    return _checked(dump_dom(f"http://127.0.0.1:{port}/{query}"))


def _checked(html: str) -> _Node:
    page = _Tree(html).root
    assert "stale" not in page.by_id("status").classes(), page.by_id("status").all_text()
    return page


def _clicked_through(port: int, job: str) -> list[_Node]:
    """The page after each of these clicks (real ones, in a browser): the job's link; the straggle
    probability column's heading twice (descending, then ascending) and the "flagged" filter; the
    "copied" filter and the task column's heading; "t1" typed in the search box and "finished"."""
    steps = [
        f"""await until(() => document.querySelector('tr[data-job="{job}"] a'));
        await click('tr[data-job="{job}"] a', 'job={job}');""",
        """await click('th[data-sort="probability"] a', 'sort=probability&order=desc');
        await click('th[data-sort="probability"] a', 'sort=probability&order=asc');
        await click('a[data-show="flagged"]', 'show=flagged');""",
        """await click('a[data-show="copied"]', 'show=copied');
        await click('th[data-sort="task"] a', 'sort=task&order=asc');""",
        """const box = document.getElementById("search");
        box.value = "t1";
        box.dispatchEvent(new Event("input"));
        await until(() => location.search.includes("q=t1") && settled());
        await click('a[data-show="finished"]', 'show=finished');""",
    ]
    pages = browse(f"http://127.0.0.1:{port}/", [CLICK + step + DOM for step in steps])
    return [_checked(html) for html in pages]


@dataclass
class _TaskTruth:
    """What the topics carried about one task."""

    machine: str = ""
    starts: list[float] = field(default_factory=list)
    finish: tuple[float, int] | None = None
    prediction: tuple[float, float | None, float | None] | None = None
    flagged: bool = False
    duplicates: list[tuple[float, int | None]] = field(default_factory=list)
    kills: list[tuple[float, int | None]] = field(default_factory=list)
    note: tuple[float, str] | None = None
    """The mitigator's latest note: why it has no command."""

    @property
    def copy(self) -> int | None:
        """The attempt a copy ran as: the first duplicate issued while the task had not finished."""
        for t, attempt in sorted(self.duplicates, key=lambda d: d[0]):
            if self.finish is None or t < self.finish[0]:
                return (attempt or 0) + 1
        return None

    @property
    def copy_result(self) -> str:
        if self.copy is None:
            return ""
        return "won" if self.finish is not None and self.finish[1] == self.copy else "lost"

    @property
    def attempts(self) -> int:
        return 1 + (self.copy is not None)

    @property
    def elapsed(self) -> float:
        assert self.finish is not None
        return self.finish[0] - min(self.starts)


@dataclass
class _JobTruth:
    started: float | None = None
    expected: int | None = None
    tasks: dict[str, _TaskTruth] = field(default_factory=dict)
    commands: int = 0
    reasons: list[tuple[str, str, str]] = field(default_factory=list)
    """(task, action, reason (policy)) of each command."""


def _what_the_topics_carried(bootstrap: str, topics: TopicNames) -> dict[str, _JobTruth]:
    jobs: dict[str, _JobTruth] = {}
    for topic in (topics.job_events, topics.checkpoints, topics.predictions, topics.commands, topics.notes):
        for value in read_topic(bootstrap, topic):
            try:
                events = decode_each(value)
            except SchemaError:
                continue
            for e in events:
                if isinstance(e, JobEvent) and e.event == "started":
                    job = jobs.setdefault(e.job_id, _JobTruth())
                    job.started, job.expected = e.time, e.expected_tasks
                elif isinstance(e, TaskCheckpoint | Prediction | RelaunchCommand | MitigationNote):
                    job = jobs.setdefault(e.job_id, _JobTruth())
                    _carried(job, job.tasks.setdefault(e.task_id, _TaskTruth()), e)
    return jobs


def _carried(
    job: _JobTruth, task: _TaskTruth, e: TaskCheckpoint | Prediction | RelaunchCommand | MitigationNote
) -> None:
    if isinstance(e, TaskCheckpoint):
        task.machine = e.machine_id
        task.starts += [] if e.start_time is None else [e.start_time]
        if e.status == "finished" and task.finish is None:
            task.finish = (e.checkpoint_time, e.attempt)
    elif isinstance(e, Prediction):
        task.flagged |= e.is_straggler
        if task.prediction is None or e.checkpoint_time >= task.prediction[0]:
            task.prediction = (e.checkpoint_time, e.adjusted_latency, e.straggle_probability)
    elif isinstance(e, MitigationNote):
        if task.note is None or e.checkpoint_time >= task.note[0]:
            task.note = (e.checkpoint_time, e.reason)
    else:
        job.commands += 1
        job.reasons.append((e.task_id, e.action, f"{e.reason} ({e.policy})"))
        assert e.action in ("duplicate", "kill"), "the speculate policy copies and kills"
        (task.duplicates if e.action == "duplicate" else task.kills).append((e.checkpoint_time, e.attempt))


def _cells(row: _Node) -> dict[str, _Node]:
    """A task row's cells by column (each cell's first class names it)."""
    return {sorted(cell.classes() - {"num"})[0]: cell for cell in row.children if cell.tag == "td"}


def _task_rows(page: _Node) -> list[tuple[str, dict[str, _Node]]]:
    rows = page.by_id("tasks").find(lambda n: n.tag == "tr" and "data-task" in n.attrs)
    return [(row.attrs["data-task"], _cells(row)) for row in rows]


def _value(cell: _Node) -> float | None:
    return float(cell.attrs["data-value"]) if "data-value" in cell.attrs else None


def _figures(page: _Node) -> dict[str, float | None]:
    cards = page.find(lambda n: "data-figure" in n.attrs)
    return {c.attrs["data-figure"]: _value(c) for c in cards}


def test_the_page_shows_jobs_tasks_and_timelines_as_the_topics_and_the_replay_report_say(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    if chromium() is None:  # a failure, not a skip: CI must never pass without looking at the page
        pytest.fail(
            "chromium not installed: scripts/setup.sh installs it when run as root (apt-get install chromium)"
        )
    topics = TopicNames(fresh_topic_prefix)
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    traces = [
        make_job(120, seed=31, job_id="view-a", signal=0.5, interval=INTERVAL, waves=4, wave_gap=30.0),
        make_job(120, seed=32, job_id="view-b", signal=0.5, interval=INTERVAL, waves=4, wave_gap=30.0),
    ]
    port = _free_port()
    with pipeline_and_view(kafka_bootstrap, topics, tmp_path, port, checkpoint_seconds=INTERVAL) as group:
        result = closed_loop_replay(traces, kafka_bootstrap, topics, group, checkpoint_seconds=INTERVAL)
        assert result.commands_applied > 0, "the scenario must issue commands"
        summary = replay_summary(
            traces,
            result,
            read_outputs(kafka_bootstrap, topics),
            method="nurd",
            policy="speculate",
            seed=0,
            checkpoint_seconds=INTERVAL,
        )
        (tmp_path / "summary.json").write_text(json.dumps(summary))  # as straggler replay writes it
        report = json.loads((tmp_path / "summary.json").read_text())
        carried = _what_the_topics_carried(kafka_bootstrap, topics)

        def caught_up(s: dict[str, Any]) -> bool:
            finished = all(
                row["finished"] == sum(t.finish is not None for t in carried[row["job_id"]].tasks.values())
                for row in s["jobs"]
            )
            totals = s["totals"]
            return bool(totals["commands"] == report["commands"] and totals["jobs_ended"] == 2 and finished)

        wait_for(port, caught_up, 60.0)
        jobs_page = _page(port)
        job = "view-a"
        truth = carried[job]
        by_elapsed = _page(port, f"?job={job}&sort=elapsed&order=desc")
        opened, by_probability, copied, searched = _clicked_through(port, job)

    # Across jobs: the figures straggler replay's summary.json reports for the same run.
    figures = _figures(jobs_page)
    assert report["copies"] > 0 and report["copies_won"] > 0, "the scenario must race copies"
    for key in ("jobs", "copies", "copies_won", "copies_lost", "predictions", "commands", "dead_letters"):
        assert figures[key] == report[key], key
    assert figures["mean_jct"] == pytest.approx(report["mean_jct_after"], rel=1e-9)
    # Extra machine time: a lost copy runs in the replay until the earlier of its kill and its own end;
    # the topics carry the kill only, so the view may count up to one checkpoint interval more per
    # lost copy (the kill comes at the first checkpoint after the winner's finish), never less.
    extra = figures["extra_machine_seconds"]
    assert extra is not None and extra > 0
    assert report["extra_machine_seconds"] - 1e-6 <= extra
    assert extra <= report["extra_machine_seconds"] + report["copies_lost"] * INTERVAL + 1e-6
    assert "saving" not in jobs_page.all_text().lower() and "saved" not in jobs_page.all_text().lower()

    rows = {r.attrs["data-job"]: r for r in jobs_page.by_id("jobs").find(lambda n: "data-job" in n.attrs)}
    assert set(rows) == {t.job_id for t in traces}
    for job_id, row in rows.items():
        text = {sorted(c.classes() - {"num"})[0]: c.all_text() for c in row.children if c.classes()}
        job_truth = carried[job_id]
        finished = sum(t.finish is not None for t in job_truth.tasks.values())
        assert text["progress"].startswith(f"{finished} / {job_truth.expected}")
        assert text["flagged"] == str(sum(t.flagged for t in job_truth.tasks.values()))
        assert text["commands"] == str(job_truth.commands)
        assert text["copies"] == str(sum(t.copy is not None for t in job_truth.tasks.values()))
        won = sum(t.copy_result == "won" for t in job_truth.tasks.values())
        lost = sum(t.copy_result == "lost" for t in job_truth.tasks.values())
        assert text["wonlost"] == f"{won} / {lost}"

    # A job's task table, sorted by elapsed time: the longest first, each row as the topics say.
    shown = _task_rows(by_elapsed)
    assert len(shown) == min(ROWS, len(truth.tasks))
    expected_order = sorted(truth.tasks, key=lambda task: (-truth.tasks[task].elapsed, task))[:ROWS]
    assert [task for task, _ in shown] == expected_order
    for task_id, cells in shown:
        task = truth.tasks[task_id]
        assert _value(cells["elapsed"]) == pytest.approx(task.elapsed, abs=1e-9)
        assert cells["attempts"].all_text() == str(task.attempts)
        assert cells["machine"].all_text() == task.machine
        assert cells["status"].children[0].all_text() == "finished"
        assert cells["copy"].all_text() == task.copy_result
        assert task.prediction is not None, "every task was judged at least once"
        assert _value(cells["predicted"]) == pytest.approx(task.prediction[1])
        assert _value(cells["probability"]) == pytest.approx(task.prediction[2])
    more = by_elapsed.by_id("tasks-more").all_text()
    assert more.startswith(f"{len(truth.tasks) - ROWS} more"), "the rows left out are counted"
    assert [task for task, _ in _task_rows(opened)] == expected_order, "a click opens the same view"
    quantiles = _figures(by_elapsed)
    finished_elapsed = [t.elapsed for t in truth.tasks.values() if t.finish is not None]
    assert quantiles["finished"] == len(finished_elapsed)
    for key, value in zip(("p50", "p90", "p99"), np.percentile(finished_elapsed, [50, 90, 99]), strict=True):
        assert quantiles[key] == pytest.approx(value), key
    assert quantiles["max"] == pytest.approx(max(finished_elapsed))

    # Filtered to the flagged tasks, sorted by straggle probability, lowest first.
    flagged = _task_rows(by_probability)
    flagged_truth = {task for task, t in truth.tasks.items() if t.flagged}
    assert 0 < len(flagged_truth) <= ROWS
    assert {task for task, _ in flagged} == flagged_truth

    def probability(task: str) -> float | None:
        judged = truth.tasks[task].prediction
        return None if judged is None else judged[2]

    with_one = sorted((p, task) for task in flagged_truth if (p := probability(task)) is not None)
    without = sorted(task for task in flagged_truth if probability(task) is None)
    assert [task for task, _ in flagged] == [task for _, task in with_one] + without, (
        "ties by task, none last"
    )
    # Each flagged task without a copy says why (the mitigator's note: price, budget, rule not met).
    held = {task for task in flagged_truth if truth.tasks[task].copy is None}
    assert held, "the scenario must leave a flagged task without a copy"
    for task_id, cells in flagged:
        note = truth.tasks[task_id].note
        said = cells["status"].find(lambda n: "why" in n.classes())
        if task_id in held:
            assert note is not None and note[1].startswith("no copy: "), task_id
            assert [n.all_text() for n in said] == [note[1]], task_id
        else:
            assert said == [], task_id

    # The job's commands, newest first, each with its reason and the probability or rule behind it.
    shown_commands = by_elapsed.by_id("commands").find(lambda n: n.tag == "tr" and "command" in n.classes())
    assert len(shown_commands) == min(ROWS, truth.commands)
    listed = [
        (_cells(row)["task"].all_text(), _cells(row)["action"].all_text(), _cells(row)["reason"].all_text())
        for row in shown_commands
    ]
    assert set(listed) <= set(truth.reasons)
    duplicates = [r for _, action, r in listed if action == "duplicate"]
    assert duplicates and all(r.startswith("copy: ") and r.endswith("(speculate)") for r in duplicates)
    assert any("(p = " in r or "Spark's rule" in r for r in duplicates), duplicates

    # Filtered to the copied tasks, and by a search with a status.
    copied_truth = sorted(task for task, t in truth.tasks.items() if t.copy is not None)
    assert [task for task, _ in _task_rows(copied)] == copied_truth
    found = sorted(task for task, t in truth.tasks.items() if "t1" in task and t.finish is not None)
    assert [task for task, _ in _task_rows(searched)] == found[:ROWS]
    assert "on" in searched.find(lambda n: n.attrs.get("data-show") == "finished")[0].classes()

    # The job's timeline: a lane per task with a copy or a flag, a bar per attempt, kills marked.
    lanes = {g.attrs["data-task"]: g for g in by_elapsed.by_id("timeline-svg").find(lambda n: n.tag == "g")}
    lane_truth = {task for task, t in truth.tasks.items() if t.attempts > 1 or t.flagged}
    assert re.search(rf"\b{len(lane_truth)}\b", by_elapsed.by_id("timeline-note").all_text())
    assert set(lanes) <= lane_truth and len(lanes) == min(ROWS, len(lane_truth))
    checked_copies = 0
    for task_id, lane in lanes.items():
        task = truth.tasks[task_id]
        bars = lane.find(lambda n: n.tag == "rect")
        assert sorted(int(b.attrs["data-attempt"]) for b in bars) == list(range(task.attempts))
        copies = [b for b in bars if "copy" in b.classes()]
        assert len(copies) == (task.copy is not None)
        kills = lane.find(lambda n: n.tag == "line" and "kill" in n.classes())
        assert len(kills) == len(task.kills), task_id
        if copies:
            checked_copies += 1
            winner = next(b for b in bars if "finished" in b.classes())
            assert task.finish is not None and int(winner.attrs["data-attempt"]) == task.finish[1]
            assert ("finished" in copies[0].classes()) == (task.copy_result == "won")
    assert checked_copies > 0, "the timeline shows at least one race"
