"""The embedded broker's failure paths, with fake ``mvn`` and ``java`` scripts (no JVM, no network).

Each test puts a directory of fakes first on PATH and points the jar cache (``XDG_CACHE_HOME``) at a
temporary directory, so the real cache and the session broker are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from straggler.kafka import embedded
from straggler.kafka.embedded import (
    BrokerPrerequisiteError,
    BrokerStartError,
    EmbeddedKafka,
    ensure_kafka_jars,
    kafka_home,
)

FAKE_JAVA = """#!/bin/sh
case "$*" in
  *" -version"*|"-version") echo 'openjdk version "17.0.9" 2023-10-17' >&2; exit 0 ;;
  *kafka.tools.StorageTool*) exit 0 ;;
esac
MODE
"""
DIES = 'echo "FATAL fake broker: could not bind the listener"; exit 3'
IGNORES_SIGTERM = """trap 'echo TERM >> "{marks}"' TERM
echo $$ > "{marks}.pid"
while :; do sleep 0.05; done"""


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of the fakes and the few tools they use (no real java or mvn), and a private jar cache."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for tool in ("sh", "sleep", "echo", "mkdir", "touch", "cat"):  # what the fakes use, nothing else
        real = next((Path(d) / tool for d in ("/bin", "/usr/bin") if (Path(d) / tool).exists()), None)
        if real is not None:
            (fakes / tool).symlink_to(real)
    monkeypatch.setenv("PATH", str(fakes))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fakes


def resolved_jars() -> Path:
    """Pretend an earlier start resolved the jars (the marker and one jar), so no ``mvn`` runs."""
    home = kafka_home()
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "kafka_2.13-fake.jar").touch()
    (home / ".resolved").write_text("fake\n")
    return home / "libs"


def kill_if_alive(pid_file: Path) -> None:
    """Clean up after a failed test: the fake's process group, if it is still there."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)


# ---------------------------------------------------------------- resolving the jars


def test_without_mvn_the_first_resolve_names_maven(bin_dir: Path) -> None:
    with pytest.raises(BrokerPrerequisiteError, match=r"`mvn` is not on PATH.*apt-get install maven"):
        ensure_kafka_jars()
    assert not (kafka_home() / ".resolved").exists()


def test_without_mvn_a_resolved_cache_is_enough(bin_dir: Path) -> None:
    libs = resolved_jars()
    assert ensure_kafka_jars() == libs


def test_a_maven_resolve_failure_reports_maven_s_output_and_leaves_no_marker(bin_dir: Path) -> None:
    executable(
        bin_dir / "mvn", "#!/bin/sh\necho '[ERROR] Could not resolve dependencies for project'\nexit 1\n"
    )
    with pytest.raises(BrokerPrerequisiteError) as raised:
        ensure_kafka_jars()
    assert "exit 1" in str(raised.value)
    assert "Could not resolve dependencies" in str(raised.value)
    assert not (kafka_home() / ".resolved").exists()


def test_a_maven_run_that_copies_no_kafka_jar_is_a_failure(bin_dir: Path) -> None:
    executable(bin_dir / "mvn", "#!/bin/sh\nexit 0\n")
    with pytest.raises(BrokerPrerequisiteError, match="exit 0"):
        ensure_kafka_jars()
    assert not (kafka_home() / ".resolved").exists()


def test_a_successful_resolve_runs_maven_once(bin_dir: Path, tmp_path: Path) -> None:
    calls = tmp_path / "mvn-calls"
    executable(
        bin_dir / "mvn",
        f"""#!/bin/sh
echo run >> "{calls}"
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}" ;; esac
done
mkdir -p "$out" && touch "$out/kafka_2.13-3.9.1.jar"
""",
    )
    libs = ensure_kafka_jars()
    assert (libs / "kafka_2.13-3.9.1.jar").exists() and (kafka_home() / ".resolved").exists()
    assert ensure_kafka_jars() == libs
    assert calls.read_text().split() == ["run"]


# ---------------------------------------------------------------- starting and stopping


def test_a_jvm_that_exits_before_it_is_ready_fails_the_start_fast_with_its_log(
    bin_dir: Path, tmp_path: Path
) -> None:
    resolved_jars()
    executable(bin_dir / "java", FAKE_JAVA.replace("MODE", DIES))
    broker = EmbeddedKafka(port=0, data_dir=tmp_path / "data", ready_timeout=30.0, stop_timeout=5.0)
    began = time.monotonic()
    with pytest.raises(BrokerStartError, match="exited before it was ready") as raised:
        broker.start()
    assert time.monotonic() - began < 10.0  # noticed the death, did not wait out the ready timeout
    assert "could not bind the listener" in str(raised.value)  # the log's tail is in the error
    assert not broker.pid_file.exists() and not broker.port_file.exists()
    assert not broker.status().running


def test_a_broker_that_never_answers_is_stopped_escalating_to_sigkill(bin_dir: Path, tmp_path: Path) -> None:
    """The JVM ignores SIGTERM and never listens: the start times out, and its stop must SIGKILL."""
    resolved_jars()
    marks = tmp_path / "marks"
    executable(bin_dir / "java", FAKE_JAVA.replace("MODE", IGNORES_SIGTERM.format(marks=marks)))
    broker = EmbeddedKafka(port=0, data_dir=tmp_path / "data", ready_timeout=1.5, stop_timeout=0.5)
    try:
        with pytest.raises(BrokerStartError, match="did not answer within"):
            broker.start()
        pid = int(Path(f"{marks}.pid").read_text())
        assert marks.read_text().split() == ["TERM"]  # asked politely first, and it refused
        assert not embedded._pid_alive(pid)
        assert not broker.pid_file.exists()
    finally:
        kill_if_alive(Path(f"{marks}.pid"))


def test_stop_of_a_broker_started_elsewhere_escalates_to_sigkill(bin_dir: Path, tmp_path: Path) -> None:
    """``straggler broker stop`` on a JVM another process started (not our Popen) that ignores SIGTERM."""
    marks = tmp_path / "marks"
    java = executable(bin_dir / "java", FAKE_JAVA.replace("MODE", IGNORES_SIGTERM.format(marks=marks)))
    data = tmp_path / "data"
    data.mkdir()
    process = subprocess.Popen(
        [str(java), "kafka.Kafka", str(data.resolve() / "server.properties")], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10.0
        while not Path(f"{marks}.pid").exists() and time.monotonic() < deadline:  # its trap is set
            time.sleep(0.02)
        (data / "broker.pid").write_text(f"{process.pid}\n")
        (data / "broker.port").write_text("1\n")
        broker = EmbeddedKafka(data_dir=data, stop_timeout=0.5)
        assert broker.status().running
        assert broker.stop() is True
        assert marks.read_text().split() == ["TERM"]
        assert not embedded._pid_alive(process.pid)
        assert not broker.status().running and not (data / "broker.pid").exists()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
