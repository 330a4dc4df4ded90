"""Every ``straggler`` subcommand refuses a wrong option value at once: exit status 2, one line on
stderr naming the option, no traceback, before it touches a broker, a trace or a child process.

Each case runs as its own process, forked from one that imported the CLI once
(`harness.cli_process`). Where a command would otherwise connect,
its bootstrap is a port nothing listens on; the process timeout is only a hang guard.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from harness.cli_process import run_cli
from test_cli_commands import ROOT, TIMEOUT_S, straggler

NOBODY = "127.0.0.1:1"
"""A bootstrap address nothing listens on: a command that got past its options would fail or hang."""

WRONG_VALUES = {
    "replay --policy nonsense": (
        ["replay", "--format", "synthetic", "--policy", "nonsense", "--out", "OUT"],
        "--policy",
    ),
    "replay missing trace": (
        ["replay", "--format", "google-2011", "--trace", "NOWHERE", "--out", "OUT"],
        "--trace",
    ),
    "replay without --trace": (["replay", "--format", "google-2011", "--out", "OUT"], "--trace"),
    "evaluate missing trace": (
        ["evaluate", "--format", "alibaba-2018", "--trace", "NOWHERE", "--out", "OUT"],
        "--trace",
    ),
    "replay --checkpoint-seconds -5": (
        ["replay", "--format", "synthetic", "--checkpoint-seconds", "-5", "--out", "OUT"],
        "--checkpoint-seconds",
    ),
    "evaluate --methods": (
        ["evaluate", "--format", "synthetic", "--methods", "nurd,nonsense", "--out", "OUT"],
        "--methods",
    ),
    "evaluate --policies": (
        ["evaluate", "--format", "synthetic", "--policies", "limited:x", "--out", "OUT"],
        "--policies",
    ),
    "train --method": (["train", "--format", "synthetic", "--method", "fast", "--out", "OUT"], "--method"),
    "worker --method nonsense": (["worker", "--bootstrap", NOBODY, "--method", "nonsense"], "--method"),
    "worker --method oracle": (["worker", "--bootstrap", NOBODY, "--method", "oracle"], "told the future"),
    "worker --loglevel chatty": (["worker", "--bootstrap", NOBODY, "--loglevel", "chatty"], "--loglevel"),
    "worker --live-interval -1": (
        ["worker", "--bootstrap", NOBODY, "--live-interval", "-1"],
        "--live-interval",
    ),
    "worker --abandon-after 0": (
        ["worker", "--bootstrap", NOBODY, "--abandon-after", "0"],
        "--abandon-after",
    ),
    "worker --abandon-after soon": (
        ["worker", "--bootstrap", NOBODY, "--abandon-after", "soon"],
        "--abandon-after",
    ),
    "topics create --topic-prefix": (["topics", "create", "--topic-prefix", "a b"], "--topic-prefix"),
    "worker --partitions 0": (["worker", "--bootstrap", NOBODY, "--partitions", "0"], "--partitions"),
    "worker --bootstrap": (["worker", "--bootstrap", "nohost"], "--bootstrap"),
    "mitigate --policy": (["mitigate", "--bootstrap", NOBODY, "--policy", "fastest"], "--policy"),
    "mitigate --policy with a name too long": (
        ["mitigate", "--bootstrap", NOBODY, "--policy", "speculate:" + "9" * 60],
        "--policy",
    ),
    "mitigate --policy speculate@0": (
        ["mitigate", "--bootstrap", NOBODY, "--policy", "speculate@0"],
        "--policy",
    ),
    "mitigate --batch-size": (["mitigate", "--bootstrap", NOBODY, "--batch-size", "0"], "--batch-size"),
    "mitigate --metrics-port": (
        ["mitigate", "--bootstrap", NOBODY, "--metrics-port", "70000"],
        "--metrics-port",
    ),
    "dask-executor --scheduler": (
        ["dask-executor", "--bootstrap", NOBODY, "--scheduler", "no-port"],
        "--scheduler",
    ),
    "dask-executor --kill-grace": (
        ["dask-executor", "--bootstrap", NOBODY, "--scheduler", "127.0.0.1:8786", "--kill-grace", "-1"],
        "--kill-grace",
    ),
    "produce --speed": (
        ["produce", "--bootstrap", NOBODY, "--format", "synthetic", "--speed", "-1"],
        "--speed",
    ),
    "produce --topic-prefix": (
        ["produce", "--bootstrap", NOBODY, "--format", "synthetic", "--topic-prefix", "a b"],
        "--topic-prefix",
    ),
    "view --port 99999": (["view", "--bootstrap", NOBODY, "--port", "99999"], "--port"),
    "topics create --partitions 0": (
        ["topics", "create", "--bootstrap", NOBODY, "--partitions", "0"],
        "--partitions",
    ),
    "smoke --messages": (["smoke", "--bootstrap", NOBODY, "--messages", "-3"], "--messages"),
    "worker --broker-timeout 0": (
        ["worker", "--bootstrap", NOBODY, "--broker-timeout", "0"],
        "--broker-timeout",
    ),
    "mitigate --broker-timeout nan": (
        ["mitigate", "--bootstrap", NOBODY, "--broker-timeout", "nan"],
        "--broker-timeout",
    ),
    "topics create --broker-timeout -1": (
        ["topics", "create", "--bootstrap", NOBODY, "--broker-timeout", "-1"],
        "--broker-timeout",
    ),
    "broker start --port": (["broker", "start", "--port", "65536"], "--port"),
}


@pytest.mark.parametrize("case", sorted(WRONG_VALUES))
def test_a_wrong_option_value_fails_in_one_line_with_exit_2(case: str, tmp_path: Path) -> None:
    argv, option = WRONG_VALUES[case]
    argv = [str(tmp_path / a) if a in ("OUT", "NOWHERE") else a for a in argv]
    result = run_cli(argv, ROOT, TIMEOUT_S)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("straggler ") and "error:" in lines[0] and option in lines[0]
    assert not (tmp_path / "OUT").exists()


def subcommand_help(name: str) -> str:
    """``straggler NAME --help``, its whitespace folded to single spaces."""
    from straggler.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(action.choices[name].format_help().split())


def test_the_top_level_help_is_a_sentence_and_every_default_is_shown() -> None:
    from straggler.cli import DESCRIPTION

    assert DESCRIPTION[0].isupper() and DESCRIPTION.endswith(".") and "``" not in DESCRIPTION
    worker_help = subcommand_help("worker")
    for shown in ("(default: 30.0)", "(default: warning)", "(default: nurd)", "nurd-paper", "(default: 0)"):
        assert shown in worker_help, shown
    mitigate_help = subcommand_help("mitigate")
    assert "(default: 300.0)" in mitigate_help and "mantri-duplicate" in mitigate_help


MINIMAL_ARGS = {
    "evaluate": ["--format", "synthetic", "--out", "o"],
    "train": ["--format", "synthetic", "--method", "admm", "--out", "o"],
    "worker": ["--bootstrap", NOBODY],
    "produce": ["--format", "synthetic"],
    "mitigate": ["--bootstrap", NOBODY],
    "dask-executor": ["--bootstrap", NOBODY, "--scheduler", "tcp://127.0.0.1:8786"],
    "replay": ["--format", "synthetic", "--out", "o"],
    "view": ["--bootstrap", NOBODY],
    "smoke": [],
}


@pytest.mark.parametrize("command", sorted(MINIMAL_ARGS))
def test_every_command_takes_verbose(command: str) -> None:
    from straggler.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([command, *MINIMAL_ARGS[command], "-v"]).verbose
    assert not parser.parse_args([command, *MINIMAL_ARGS[command]]).verbose


@pytest.mark.broker
@pytest.mark.scenario  # a watchdog and its spawned consumer, end to end: about 30 s
def test_mitigate_verbose_reaches_the_consumer_under_the_watchdog(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    """The watchdog's consumer is a spawned process: it logs at debug level when told ``-v``."""
    from confluent_kafka import Producer

    from straggler.kafka.config import producer_config
    from straggler.kafka.names import TopicNames
    from straggler.kafka.topics import create_topics

    topics = TopicNames(fresh_topic_prefix)
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    producer = Producer(producer_config(kafka_bootstrap))
    producer.produce(topics.predictions, key=b"j", value=b"not json")  # one record, one transaction
    assert producer.flush(30) == 0
    common = [
        "mitigate",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        topics.prefix,
        "--idle-timeout",
        "3",
    ]
    verbose = straggler(*common, "--group", f"{topics.prefix}verbose", "-v")
    quiet = straggler(*common, "--group", f"{topics.prefix}quiet")
    assert verbose.returncode == quiet.returncode == 0, verbose.stderr + quiet.stderr
    assert "DEBUG consumers.mitigation: transaction 1: 1 records" in verbose.stderr
    assert "DEBUG" not in quiet.stderr and "INFO consumers.cli: mitigator: broker" in quiet.stderr
