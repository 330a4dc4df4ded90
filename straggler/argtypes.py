"""What every ``straggler`` command's options share: value types that refuse a wrong value at parse
time, a help formatter that shows every default, a parser whose errors are one line and which gives
every command ``-v``, and the logging setup ``-v`` switches.

A wrong value then ends the command at once with ``straggler <command>: error: ...`` on stderr and
exit status 2, before any broker, trace or child process is touched.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

OWN_LOGGERS = ("straggler", "pipeline", "producers", "consumers", "schemas")
"""The loggers of this package's modules (each logs as its module, ``logging.getLogger(__name__)``)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The ``--loglevel`` choices, as Python's logging names them (lower case)."""

TOPIC_PREFIX = re.compile(r"[A-Za-z0-9._-]{0,200}")
"""Characters Kafka allows in a topic name; the prefix leaves room for the longest suffix."""

HOST_PORT = re.compile(r"(?:[A-Za-z_]+://)?\[?[A-Za-z0-9._:-]+\]?:(\d{1,5})")
"""One bootstrap server: an optional ``protocol://``, a host (or ``[IPv6]``) and a port."""


POLICY_NAME_LIMIT = 64
"""The longest policy name a relaunch command carries (schemas/relaunch_command.v2.schema.json)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` after every option with a default, unless its help already says it
    (options whose default is None or off say what that means in their help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or "default" in help_text:
            return help_text
        if default == "":
            return f"{help_text} (default: none)"
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrapped as argparse does, but never inside a hyphenated name (``mantri-duplicate``)."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` (and, through ``add_subparsers``, every subcommand's) that shows
    defaults in ``--help``, has ``-v/--verbose`` (unless ``verbose_option`` is False) and reports a
    usage error as one line on stderr, exit status 2."""

    def __init__(self, *args: Any, verbose_option: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        if verbose_option:
            self.add_argument("-v", "--verbose", action="store_true", help="log at debug level")

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def configure_logging(verbose: bool) -> None:
    """Log lines on stderr: this package's at INFO (DEBUG when ``verbose``), other libraries' warnings
    only, so ``-v`` shows what the pipeline does without the chatter of Faust, aiokafka or numba."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


EPOCH_TIMES_FROM = 1e9
"""Times from here on (September 2001) are Unix times (a live job's, the cluster's clock); earlier
ones are a replayed trace's seconds since its start."""


def readable_time(t: float) -> str:
    """A time for a log line: a Unix time as UTC (``2026-11-28 12:01:03.2 UTC``), a trace time as
    ``trace 600 s``."""
    if not math.isfinite(t) or t < EPOCH_TIMES_FROM:
        return f"trace {t:g} s"
    moment = datetime.fromtimestamp(t, tz=UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 100_000} UTC"


def _number(kind: Callable[[str], float], text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer ≥ 1 (counts of partitions, jobs, records)."""
    value = int(_number(int, text))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer of at least 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer ≥ 0 (seeds, counts where 0 means none)."""
    value = int(_number(int, text))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer of at least 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (intervals, timeouts)."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number greater than 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0 (a speed where 0 means as fast as possible, a grace period)."""
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of at least 0")
    return value


def port(text: str) -> int:
    """A TCP port to listen on, 1 to 65535."""
    value = int(_number(int, text))
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port from 1 to 65535")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port, or 0 for one the system picks."""
    return 0 if text.strip() == "0" else port(text)


def bootstrap_servers(text: str) -> str:
    """Kafka's ``host:port[,host:port...]``."""
    for server in text.split(","):
        match = HOST_PORT.fullmatch(server.strip())
        if match is None or not 1 <= int(match.group(1)) <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r}: expected host:port[,host:port...]")
    return text


def topic_prefix(text: str) -> str:
    """A prefix of Kafka topic names: letters, digits, ``.``, ``_`` and ``-`` only."""
    if TOPIC_PREFIX.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a topic prefix has at most 200 of the characters A-Z a-z 0-9 . _ -"
        )
    return text


def existing_dir(text: str) -> Path:
    """A directory that exists (a trace)."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return path


def existing_file(text: str) -> Path:
    """A file that exists (a model, a config file)."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


def policy(text: str) -> str:
    """A mitigation policy spec that `straggler.core.policy_spec.make_policy` accepts."""
    from straggler.core.policy_spec import make_policy

    try:
        name = make_policy(text).name
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if len(name) > POLICY_NAME_LIMIT:
        raise argparse.ArgumentTypeError(
            f"policy {text!r}: its name {name!r} is over {POLICY_NAME_LIMIT} characters, "
            "the most a command's policy field holds"
        )
    return text


def method(text: str) -> str:
    """The name of a registered straggler method (`straggler.core.registry`)."""
    from straggler.core.registry import method_names

    known = method_names()
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; known: {', '.join(known)}")
    return text


def online_method(text: str) -> str:
    """A registered method a live worker may run: any but the oracle-fed control (future information)."""
    from straggler.core.registry import ORACLE

    if method(text) == ORACLE:
        raise argparse.ArgumentTypeError(
            f"{ORACLE!r} is told the future (an evaluation control): no worker runs it"
        )
    return text


def comma_list(item: Callable[[str], str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for ``a,b,c``, each item checked by ``item``; empty items are dropped."""

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list")
        return tuple(item(part) for part in items)

    return parse
