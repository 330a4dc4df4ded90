"""A single-node Apache Kafka broker (KRaft, combined broker+controller) run from the official jars.

Why not a container: the project must run where no Docker engine exists, and its tests need a real
broker. The jars are resolved once with ``mvn`` into the user cache; a broker is identified by its data
directory, listens on 127.0.0.1 (PLAINTEXT, or SASL given a ``BrokerSecurity``; given a ``BrokerTls``
also a TLS and a mutual-TLS listener) and outlives the process that started it until ``stop()``.

The data directory and the rest: docs/architecture.md, "The embedded broker".
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

KAFKA_VERSION = "3.9.1"
SCALA_VERSION = "2.13"
SLF4J_BINDING = "org.slf4j:slf4j-reload4j:1.7.36"
MIN_JAVA_MAJOR = 17
DEFAULT_PORT = 9092
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3
"""Starts on freshly picked ports when the broker finds one taken (port 0 only)."""
JVM_OPTIONS = ("-Xmx512m", "-Xms256m", "-XX:+UseG1GC", "-XX:-UsePerfData", "-Djava.awt.headless=true")
BROKER_MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"

_PID_FILE = "broker.pid"
_PORT_FILE = "broker.port"
_TLS_PORTS_FILE = "broker.tls-ports"
_LOG_FILE = "broker.log"
_SERVER_PROPERTIES = "server.properties"
_LOG4J_PROPERTIES = "log4j.properties"
_LOG_DIRS = "kraft-logs"
_RESOLVED_MARKER = ".resolved"
_PR_SET_PDEATHSIG = 1


class BrokerError(RuntimeError):
    """Base class of the embedded broker's failures."""


class BrokerPrerequisiteError(BrokerError):
    """A tool the broker needs (java >= 17, mvn for the first resolve) is missing or too old."""


class BrokerStartError(BrokerError):
    """The JVM did not become a working broker (it died, or did not answer in time)."""


@dataclass(frozen=True)
class BrokerStatus:
    """What ``straggler broker status`` reports about one data directory."""

    running: bool
    pid: int | None
    bootstrap: str | None
    log_file: Path
    data_dir: Path
    tls: TlsAddresses | None = None
    """The ``TLS`` and ``MTLS`` listeners, when it was started with them."""


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _jaas_quote(text: str) -> str:
    if '"' in text or "\\" in text:
        raise ValueError(f"SASL names and passwords of the embedded broker cannot hold quotes: {text!r}")
    return f'"{text}"'


def _scram_text(text: str) -> str:
    if any(ch in text for ch in ',[]="\\ '):
        raise ValueError(f"SCRAM names and passwords of the embedded broker must be plain words: {text!r}")
    return text


@dataclass(frozen=True)
class BrokerSecurity:
    """A SASL_PLAINTEXT client listener (what a secured cluster asks of clients, without TLS files).

    ``plain_users`` may log in with PLAIN, ``scram_users`` with SCRAM-SHA-256 and SCRAM-SHA-512 (their
    credentials are written into the KRaft metadata when the storage is formatted, so they are fixed
    at the first start of a data directory). The broker talks to itself as ``admin`` over PLAIN.
    """

    admin_password: str = "admin-secret"
    plain_users: Mapping[str, str] = field(default_factory=dict)
    scram_users: Mapping[str, str] = field(default_factory=dict)

    def listener_properties(self) -> dict[str, str]:
        """The ``server.properties`` lines of the SASL listener and its JAAS configuration."""
        users = {"admin": self.admin_password, **self.plain_users}
        plain = " ".join(f"user_{name}={_jaas_quote(pw)}" for name, pw in users.items())
        prefix = "listener.name.sasl_plaintext"
        return {
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            f"{prefix}.plain.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required username="admin" password={_jaas_quote(self.admin_password)} {plain};',
            **{
                f"{prefix}.{mechanism.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                )
                for mechanism in SASL_MECHANISMS[1:]
            },
        }

    def format_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that add the SCRAM users."""
        arguments: list[str] = []
        for name, password in self.scram_users.items():
            for mechanism in SASL_MECHANISMS[1:]:
                arguments += [
                    "--add-scram",
                    f"{mechanism}=[name={_scram_text(name)},password={_scram_text(password)}]",
                ]
        return arguments

    def admin_client_config(self) -> dict[str, str]:
        """librdkafka keys with which the broker's own readiness check logs in."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": self.admin_password,
        }


TLS_LISTENER = "TLS"
MTLS_LISTENER = "MTLS"


def _properties_value(text: str) -> str:
    """``text`` as one ``server.properties`` value (Java's ``Properties`` reads ``\\n`` as a newline)."""
    return text.strip().replace("\\", "\\\\").replace("\n", "\\n")


@dataclass(frozen=True)
class BrokerTls:
    """Two TLS client listeners beside the broker's own: ``TLS`` (clients check the broker's
    certificate) and ``MTLS`` (the broker also requires a client certificate signed by ``client_ca``).

    The files are PEM, read at every start and written into ``server.properties`` as Kafka's PEM
    keystore (``ssl.keystore.type=PEM``), so no JKS store or keytool is needed: ``certificate_chain``
    holds the broker's certificate (then any intermediates) for 127.0.0.1, ``private_key`` its
    unencrypted PKCS#8 key, ``client_ca`` the CA certificates trusted for client certificates.
    """

    certificate_chain: Path
    private_key: Path
    client_ca: Path

    def listener_properties(self) -> dict[str, str]:
        """The ``server.properties`` lines of the PEM keystore, and of the client check on ``MTLS``."""
        mtls = f"listener.name.{MTLS_LISTENER.lower()}"
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": _properties_value(Path(self.certificate_chain).read_text()),
            "ssl.keystore.key": _properties_value(Path(self.private_key).read_text()),
            f"{mtls}.ssl.client.auth": "required",
            f"{mtls}.ssl.truststore.type": "PEM",
            f"{mtls}.ssl.truststore.certificates": _properties_value(Path(self.client_ca).read_text()),
        }


@dataclass(frozen=True)
class TlsAddresses:
    """The bootstrap addresses of a broker's ``TLS`` and ``MTLS`` listeners."""

    tls: str
    mtls: str


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/straggler-stream`` (or ``~/.cache/straggler-stream``): shared by every instance."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "straggler-stream"


def default_data_dir() -> Path:
    """The data directory used when none is given: one long-lived broker per user."""
    return user_cache_dir() / "broker"


def kafka_home(kafka_version: str = KAFKA_VERSION) -> Path:
    """Where the jars of one Kafka version are cached (``<home>/libs``)."""
    return user_cache_dir() / f"kafka-{kafka_version}"


def java_major_version(java: str) -> int:
    """Major version of a ``java`` executable, parsed from ``java -version`` (``1.8`` counts as 8)."""
    completed = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    text = completed.stderr + completed.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise BrokerPrerequisiteError(f"could not read the Java version from `{java} -version`: {text!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def require_java() -> str:
    """Path of a ``java`` >= 17, or a ``BrokerPrerequisiteError`` naming what to install."""
    java = shutil.which("java")
    if java is None:
        raise BrokerPrerequisiteError(
            f"the embedded Kafka broker needs Java {MIN_JAVA_MAJOR} or newer, but `java` is not on PATH; "
            "install a JDK/JRE (e.g. `apt-get install openjdk-17-jre-headless`) or point "
            "KAFKA_BOOTSTRAP_SERVERS at an existing broker"
        )
    major = java_major_version(java)
    if major < MIN_JAVA_MAJOR:
        raise BrokerPrerequisiteError(
            f"the embedded Kafka broker needs Java {MIN_JAVA_MAJOR} or newer, but `{java}` is Java {major}; "
            "install a newer JDK/JRE (e.g. `apt-get install openjdk-17-jre-headless`)"
        )
    return java


def require_maven() -> str:
    """Path of ``mvn``, needed only for the first resolve of the Kafka jars."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerPrerequisiteError(
            "the embedded Kafka broker resolves Apache Kafka's jars from Maven Central once, which needs "
            "Apache Maven, but `mvn` is not on PATH; install it (e.g. `apt-get install maven`)"
        )
    return mvn


def _pom_xml(kafka_version: str) -> str:
    group, artifact, version = SLF4J_BINDING.split(":")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>straggler-stream</groupId>
  <artifactId>embedded-kafka-jars</artifactId>
  <version>{kafka_version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_VERSION}</artifactId>
      <version>{kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (two test sessions resolving or starting at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_kafka_jars(kafka_version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka's jars, resolving them with Maven the first time only."""
    home = kafka_home(kafka_version)
    libs = home / "libs"
    marker = home / _RESOLVED_MARKER
    if marker.exists():
        return libs
    with _file_lock(home / ".resolve.lock"):
        if marker.exists():
            return libs
        mvn = require_maven()
        pom = home / "pom.xml"
        pom.write_text(_pom_xml(kafka_version))
        completed = subprocess.run(
            [
                mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                "-DincludeScope=runtime", f"-DoutputDirectory={libs}",
            ],
            capture_output=True, text=True, timeout=1800, check=False, cwd=home,
        )  # fmt: skip
        jars = list(libs.glob("kafka_*.jar")) if libs.is_dir() else []
        if completed.returncode != 0 or not jars:
            raise BrokerPrerequisiteError(
                f"could not resolve Apache Kafka {kafka_version} from Maven Central with `mvn` "
                f"(exit {completed.returncode}):\n{(completed.stdout + completed.stderr)[-4000:]}"
            )
        marker.write_text(f"kafka_{SCALA_VERSION}:{kafka_version} {SLF4J_BINDING}\n")
    return libs


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's ``Uuid`` form)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka's tools refuse ids that read as an option
            return text


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only (``server.properties`` holds SASL passwords and the
    TLS listeners' private key)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(text)


def _other_free_ports(taken: int, count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, none of them ``taken``."""
    ports: list[int] = []
    while len(ports) < count:
        candidate = free_port()
        if candidate != taken and candidate not in ports:
            ports.append(candidate)
    return ports


def _port_accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (reaping it when it is our child)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _cmdline(pid: int) -> str | None:
    """The process's command line, or None where /proc does not tell (non-Linux)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _terminate_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when its parent dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None

    def set_parent_death_signal() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def _lost_a_port(log_file: Path, start: int) -> bool:
    """The broker's log past byte ``start`` says a port it was given was taken when it bound it."""
    try:
        with log_file.open("rb") as log:
            log.seek(start)
            return b"Address already in use" in log.read()
    except OSError:
        return False


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log file)"


class EmbeddedKafka:
    """One single-node KRaft broker, identified by its data directory."""

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        data_dir: Path | str | None = None,
        kafka_version: str = KAFKA_VERSION,
        ready_timeout: float = READY_TIMEOUT_S,
        stop_timeout: float = STOP_TIMEOUT_S,
        die_with_parent: bool = False,
        security: BrokerSecurity | None = None,
        tls: BrokerTls | None = None,
    ) -> None:
        self.port = port
        self.security = security
        self.tls = tls
        self.data_dir = (
            (Path(data_dir) if data_dir is not None else default_data_dir()).expanduser().resolve()
        )
        self.kafka_version = kafka_version
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        """Linux only: the kernel SIGTERMs the JVM when the thread that started it dies, so a test run
        killed before its cleanup leaves no broker behind. Off for ``straggler broker start``."""
        self._process: subprocess.Popen[bytes] | None = None
        self.started_here = False
        """True when ``start()`` launched the JVM (not when it found one already running)."""

    @property
    def log_file(self) -> Path:
        return self.data_dir / _LOG_FILE

    @property
    def pid_file(self) -> Path:
        return self.data_dir / _PID_FILE

    @property
    def port_file(self) -> Path:
        return self.data_dir / _PORT_FILE

    @property
    def tls_ports_file(self) -> Path:
        return self.data_dir / _TLS_PORTS_FILE

    def tls_addresses(self) -> TlsAddresses | None:
        """Where the running broker's TLS listeners are (None: it has none, or it is not running)."""
        try:
            tls, mtls = (int(word) for word in self.tls_ports_file.read_text().split())
        except (OSError, ValueError):
            return None
        return TlsAddresses(f"127.0.0.1:{tls}", f"127.0.0.1:{mtls}")

    def _running_pid(self) -> int | None:
        """The pid from the pid file if that process is alive and is this data dir's broker."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not _pid_alive(pid):
            return None
        cmdline = _cmdline(pid)
        if cmdline is not None and (
            BROKER_MAIN_CLASS not in cmdline or str(self.data_dir / _SERVER_PROPERTIES) not in cmdline
        ):
            return None  # the pid was reused by another process
        return pid

    def _recorded_bootstrap(self) -> str | None:
        try:
            return f"127.0.0.1:{int(self.port_file.read_text().strip())}"
        except (OSError, ValueError):
            return None

    def status(self) -> BrokerStatus:
        pid = self._running_pid()
        return BrokerStatus(
            running=pid is not None,
            pid=pid,
            bootstrap=self._recorded_bootstrap() if pid is not None else None,
            log_file=self.log_file,
            data_dir=self.data_dir,
            tls=self.tls_addresses() if pid is not None else None,
        )

    def start(self) -> str:
        """Start the broker (or find it running) and return its bootstrap address once it answers."""
        java = require_java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.data_dir / ".start.lock"):
            pid = self._running_pid()
            bootstrap = self._recorded_bootstrap()
            if pid is not None and bootstrap is not None:
                self._wait_ready(bootstrap, pid)
                return bootstrap
            self._remove_state_files()
            libs = ensure_kafka_jars(self.kafka_version)
            attempt = 1
            while True:
                log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
                try:
                    return self._start_on_ports(java, libs)
                except BrokerStartError:
                    # Ports picked here are free when picked, not when the JVM binds them: another
                    # process (a second broker, a Dask worker) can take one in between.
                    lost_a_port = _lost_a_port(self.log_file, log_start)
                    if self.port != 0 or attempt == PORT_ATTEMPTS or not lost_a_port:
                        raise
                attempt += 1

    def _start_on_ports(self, java: str, libs: Path) -> str:
        """Pick the ports, write the configs, launch the JVM and wait until it answers."""
        port = free_port() if self.port == 0 else self.port
        if _port_accepts(port):
            raise BrokerStartError(
                f"port {port} on 127.0.0.1 is already in use by another process; "
                "choose another port (0 picks a free one)"
            )
        controller_port, *tls_ports = _other_free_ports(port, 3 if self.tls is not None else 1)
        self._write_configs(port, controller_port, tls_ports)
        self._format_storage(java, libs)
        self._launch(java, libs)
        assert self._process is not None
        self.started_here = True
        bootstrap = f"127.0.0.1:{port}"
        self.port_file.write_text(f"{port}\n")
        if tls_ports:
            self.tls_ports_file.write_text(" ".join(map(str, tls_ports)) + "\n")
        self.pid_file.write_text(f"{self._process.pid}\n")
        try:
            self._wait_ready(bootstrap, self._process.pid)
        except BaseException:
            self.stop()
            raise
        return bootstrap

    def stop(self) -> bool:
        """Stop the broker: SIGTERM, a bounded wait, SIGKILL only if needed. True if one was running."""
        pid = self._running_pid()
        stopped = False
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, self.stop_timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # the JVM leads its own session and group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, 10.0)
            stopped = True
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10.0)
            self._process = None
        self._remove_state_files()
        return stopped

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.pid == pid:
                if self._process.poll() is not None:
                    return True
            elif not _pid_alive(pid):
                return True
            time.sleep(0.1)
        return False

    def _remove_state_files(self) -> None:
        for path in (self.pid_file, self.port_file, self.tls_ports_file):
            path.unlink(missing_ok=True)

    def _write_configs(self, port: int, controller_port: int, tls_ports: Sequence[int] = ()) -> None:
        """``tls_ports``: the ``TLS`` and ``MTLS`` listeners' ports when ``self.tls`` is set, else none."""
        log_dirs = self.data_dir / _LOG_DIRS
        listener = "PLAINTEXT" if self.security is None else "SASL_PLAINTEXT"
        clients = {listener: port, **dict(zip((TLS_LISTENER, MTLS_LISTENER), tls_ports, strict=False))}
        advertised = ",".join(f"{name}://127.0.0.1:{number}" for name, number in clients.items())
        protocols = {listener: listener, **{name: "SSL" for name in clients if name != listener}}
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": advertised,
            "inter.broker.listener.name": listener,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(
                f"{name}:{protocol}" for name, protocol in {"CONTROLLER": "PLAINTEXT", **protocols}.items()
            ),
            **(self.security.listener_properties() if self.security is not None else {}),
            **(self.tls.listener_properties() if self.tls is not None else {}),
            "log.dirs": str(log_dirs),
            # Topics are declared explicitly (straggler.kafka.topics); Faust declares its internal
            # topics (changelogs, leader topic) itself through CreateTopics, so nothing relies on this.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.retention.check.interval.ms": "300000",
        }
        text = "".join(f"{key}={value}\n" for key, value in properties.items())
        _write_private(
            self.data_dir / _SERVER_PROPERTIES,
            "# Written by straggler.kafka.embedded at every start; edits are overwritten.\n" + text,
        )
        log4j = {
            "log4j.rootLogger": "INFO, file",
            "log4j.appender.file": "org.apache.log4j.FileAppender",
            "log4j.appender.file.File": str(self.log_file),
            "log4j.appender.file.Append": "true",
            "log4j.appender.file.layout": "org.apache.log4j.PatternLayout",
            "log4j.appender.file.layout.ConversionPattern": "[%d] %p %m (%c)%n",
            "log4j.logger.kafka.request.logger": "WARN",
            "log4j.logger.kafka.network.RequestChannel$": "WARN",
            "log4j.logger.state.change.logger": "WARN",
            "log4j.logger.kafka.authorizer.logger": "WARN",
            "log4j.logger.kafka.log.LogCleaner": "WARN",
            "log4j.logger.org.apache.kafka.storage.internals.log": "WARN",
            "log4j.logger.kafka.coordinator": "WARN",
            "log4j.logger.org.apache.kafka.coordinator": "WARN",
        }
        (self.data_dir / _LOG4J_PROPERTIES).write_text(
            "".join(f"{key}={value}\n" for key, value in log4j.items())
        )

    def _java_command(self, java: str, libs: Path, main_class: str, *args: str) -> list[str]:
        return [
            java,
            *JVM_OPTIONS,
            f"-Dlog4j.configuration=file:{self.data_dir / _LOG4J_PROPERTIES}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _format_storage(self, java: str, libs: Path) -> None:
        """Format the KRaft log directory on first start (kept across restarts of the same data dir)."""
        if (self.data_dir / _LOG_DIRS / "meta.properties").exists():
            return
        command = self._java_command(
            java, libs, STORAGE_TOOL_CLASS, "format",
            "-t", new_cluster_id(), "-c", str(self.data_dir / _SERVER_PROPERTIES),
            *(self.security.format_arguments() if self.security is not None else []),
        )  # fmt: skip
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False, cwd=self.data_dir
        )
        if completed.returncode != 0:
            raise BrokerStartError(
                f"formatting the KRaft storage in {self.data_dir / _LOG_DIRS} failed "
                f"(exit {completed.returncode}):\n{(completed.stdout + completed.stderr)[-4000:]}"
            )

    def _launch(self, java: str, libs: Path) -> None:
        command = self._java_command(java, libs, BROKER_MAIN_CLASS, str(self.data_dir / _SERVER_PROPERTIES))
        with self.log_file.open("ab") as log:
            log.write(f"\n=== straggler: starting {' '.join(command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # outlives the CLI; a Ctrl-C there does not reach it
                preexec_fn=_terminate_with_parent(os.getpid()) if self.die_with_parent else None,
            )

    def _wait_ready(self, bootstrap: str, pid: int) -> None:
        """Poll a real metadata request until the broker answers, failing fast if the JVM dies."""
        port = int(bootstrap.rsplit(":", 1)[1])
        deadline = time.monotonic() + self.ready_timeout
        admin: AdminClient | None = None
        last_error = "the port never accepted a connection"
        while time.monotonic() < deadline:
            if not self._alive(pid):
                raise BrokerStartError(
                    f"the Kafka JVM (pid {pid}) exited before it was ready; last lines of "
                    f"{self.log_file}:\n{tail(self.log_file)}"
                )
            if not _port_accepts(port):
                time.sleep(0.2)
                continue
            if admin is None:
                login = self.security.admin_client_config() if self.security is not None else {}
                admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **login})
            try:
                metadata = admin.list_topics(timeout=2.0)
            except Exception as exc:  # KafkaException while the broker is still joining its quorum
                last_error = str(exc)
                time.sleep(0.2)
                continue
            if metadata.brokers and metadata.controller_id >= 0:
                return
            last_error = "metadata had no broker or no controller yet"
            time.sleep(0.2)
        raise BrokerStartError(
            f"the Kafka broker at {bootstrap} did not answer within {self.ready_timeout:.0f} s "
            f"({last_error}); last lines of {self.log_file}:\n{tail(self.log_file)}"
        )

    def _alive(self, pid: int) -> bool:
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is None
        return _pid_alive(pid)


@contextlib.contextmanager
def _started_broker(
    port: int, data_dir: Path | None, security: BrokerSecurity | None, tls: BrokerTls | None
) -> Iterator[tuple[EmbeddedKafka, str]]:
    """A started broker and its bootstrap address for a ``with`` block (see ``embedded_kafka``)."""
    temporary = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="straggler-kafka-")) if data_dir is None else data_dir
    broker = EmbeddedKafka(port=port, data_dir=directory, die_with_parent=True, security=security, tls=tls)
    try:
        yield broker, broker.start()
    finally:
        try:
            if broker.started_here:
                broker.stop()
        finally:
            if temporary:
                shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def embedded_kafka(
    port: int = 0, data_dir: Path | None = None, security: BrokerSecurity | None = None
) -> Iterator[str]:
    """A broker for the duration of a ``with`` block, yielding ``127.0.0.1:<port>``.

    Without ``data_dir`` it runs on a fresh temporary directory that is removed afterwards. A broker
    that was already running on a given ``data_dir`` is reused and left running.
    """
    with _started_broker(port, data_dir, security, None) as (_, bootstrap):
        yield bootstrap


@contextlib.contextmanager
def embedded_tls_kafka(tls: BrokerTls, data_dir: Path | None = None) -> Iterator[TlsAddresses]:
    """A broker with the ``TLS`` and ``MTLS`` listeners of ``tls`` for a ``with`` block, yielding
    their addresses (its PLAINTEXT listener, on a free port, serves only itself)."""
    with _started_broker(0, data_dir, None, tls) as (broker, _):
        addresses = broker.tls_addresses()
        if addresses is None:  # a broker found running on data_dir was started without TLS
            raise BrokerStartError(f"the broker running on {broker.data_dir} has no TLS listeners")
        yield addresses
