"""A real single-node Apache Kafka broker (KRaft) for tests, benchmarks and local use.

The broker's jars come from Maven Central (``org.apache.kafka:kafka_2.13``) through Maven into
a cache outside the checkout (``$FORESHOCK_CACHE`` or ``~/.cache/foreshock``), once; later
starts reuse them. Needs Java 17+ and ``mvn`` on the PATH.

The broker logs at INFO to ``broker.log`` in its data folder. Kafka 4.1 logs through SLF4J 1.7
(``slf4j-api`` 1.7.36), which finds only a 1.x binding: with Log4j 2's SLF4J 2 provider alone it fell
back to its no-operation logger, and ``broker.log`` held nothing but SLF4J's "NOP logger" warning.
The jars therefore include ``log4j-slf4j-impl`` (Log4j 2's SLF4J 1.x binding), and each start
writes a Log4j 2 configuration (:data:`LOG4J_CONFIG`) beside the broker's ``server.properties``.

    python -m foreshock.ingest.kafka_local up     # starts in the background, prints 127.0.0.1:PORT
    python -m foreshock.ingest.kafka_local down
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

__all__ = ["KAFKA_VERSION", "cache_dir", "fetch_jars", "LocalKafka", "free_port"]

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>foreshock</groupId><artifactId>kafka-broker</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>
<dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
<dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
<dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
<dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
</dependencies></project>
"""

LOG4J_CONFIG = """# Written by foreshock.ingest.kafka_local: the broker logs at INFO to broker.log.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
# Kafka's own defaults: per-request and controller state-change chatter stays out
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""


def cache_dir() -> Path:
    return Path(os.environ.get("FORESHOCK_CACHE", Path.home() / ".cache" / "foreshock"))


def fetch_jars(version: str = KAFKA_VERSION) -> Path:
    """The folder holding the broker's jars, downloading them with Maven the first time.

    The folder is named by the Kafka version and a hash of the dependency list, so a change of
    the list (the logging binding) fetches anew instead of reusing a cache that lacks a jar.
    """
    pom = _POM.format(kafka=version, log4j=LOG4J_VERSION)
    libs = cache_dir() / "kafka" / f"{version}-{hashlib.sha256(pom.encode()).hexdigest()[:8]}" / "libs"
    if (libs / f"kafka_2.13-{version}.jar").exists():
        return libs
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise RuntimeError("the Kafka broker needs `java` (17+) and `mvn` on the PATH")
    work = libs.parent / "build"
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(pom)
    tmp = libs.parent / "libs.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={tmp}"],
        check=True,
    )
    tmp.rename(libs)  # atomic: a half-fetched cache is never mistaken for a complete one
    return libs


def class_archive(libs: Path) -> Path:
    """The class-data-sharing archive of the broker's classes for the ``java`` on the PATH, named by
    that binary: an archive serves only the JVM build that wrote it, so another Java (or an upgrade
    in place) writes its own."""
    java = Path(shutil.which("java") or "java").resolve()
    stat = java.stat() if java.exists() else None
    key = f"{java}:{stat.st_size if stat else 0}:{stat.st_mtime_ns if stat else 0}"
    return libs.parent / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:8]}.jsa"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    """Whether a process accepts connections on 127.0.0.1:``port``.

    A free port lies in the ephemeral range, so a connect to it while nothing listens can pick that
    same port as its source and connect to itself (TCP simultaneous open): such a socket is no answer.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            return sock.getsockname() != sock.getpeername()
    except OSError:
        return False


class LocalKafka:
    """One broker process: ``start()`` formats the log dir, launches KRaft and waits for the port."""

    def __init__(self, data_dir: Path | None = None, port: int | None = None, partitions: int = 8,
                 heap_mb: int = 768, quick_start: bool = False, class_sharing: bool = True):
        self.port = port or free_port()
        self.controller_port = free_port()
        self._owns_dir = data_dir is None  # a log dir it made itself, it removes on stop()
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="foreshock-kafka-"))
        self.partitions = partitions
        self.heap_mb = heap_mb
        self.quick_start = quick_start
        self.class_sharing = class_sharing
        self.process: subprocess.Popen | None = None
        self.libs = fetch_jars()

    @property
    def _archive_written(self) -> Path:
        """Where this broker's JVM writes the class archive at exit, when there is none yet."""
        return self.data_dir / "classes.jsa.partial"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def classpath(self) -> str:
        return str(self.libs / "*")

    def _write_config(self) -> Path:
        cfg = self.data_dir / "server.properties"
        cfg.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.data_dir / 'logs'}",
            f"num.partitions={self.partitions}",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "message.max.bytes=10485760",
        ]) + "\n")
        return cfg

    def start(self, timeout_s: float = 90) -> LocalKafka:
        """Format the log dir (first start only), launch the broker and wait for its port.

        With ``class_sharing`` the JVMs load Kafka's classes from a shared archive (class-data
        sharing) in the jar cache once a broker has written one on a clean exit (:meth:`stop`):
        most of a start is loading classes. With ``quick_start`` the broker compiles with the
        client compiler only (``-XX:TieredStopAtLevel=1``): cheaper to start, for a broker that
        lives seconds (a test's); one under sustained load (a benchmark's) wants the full compiler.
        ``benchmarks/bench_kafka_start.py`` measures both."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self._write_config()
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(LOG4J_CONFIG)
        java = ["java", f"-Xmx{self.heap_mb}m", f"-Dlog4j2.configurationFile={log4j}", "-cp", self.classpath]
        archive = class_archive(self.libs)
        flags = [f"-XX:SharedArchiveFile={archive}"] if self.class_sharing and archive.exists() else []
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id = uuid.uuid4().bytes.hex()[:22]
            subprocess.run([*java, *flags, "-XX:TieredStopAtLevel=1", "kafka.tools.StorageTool", "format",
                            "-t", cluster_id, "-c", str(cfg)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.class_sharing and not flags:
            flags = [f"-XX:ArchiveClassesAtExit={self._archive_written}"]
        if self.quick_start:
            flags.append("-XX:TieredStopAtLevel=1")
        log = open(self.data_dir / "broker.log", "ab")
        self.process = subprocess.Popen([*java, *flags, "kafka.Kafka", str(cfg)], stdout=log, stderr=log,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.process.returncode}; "
                                   f"see {self.data_dir / 'broker.log'}")
            if _accepts(self.port):
                (self.data_dir / "broker.pid").write_text(str(self.process.pid))
                return self
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"Kafka broker did not open 127.0.0.1:{self.port} in {timeout_s}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._keep_archive()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _keep_archive(self) -> None:
        """Put the class archive this broker's JVM wrote at exit into the jar cache, once a JVM
        has mapped it: one cut short (the JVM killed while writing it) crashes every JVM that maps
        it. The rename is atomic, so a broker starting meanwhile never reads half an archive."""
        written = self._archive_written
        if not written.exists():
            return
        check = subprocess.run(
            ["java", "-Xshare:on", f"-XX:SharedArchiveFile={written}", "-cp", self.classpath, "-version"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if check.returncode == 0:
            os.replace(written, class_archive(self.libs))
        else:
            written.unlink()

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


STOP_GRACE_S = 15.0


def stop_process_group(pgid: int, grace_s: float = STOP_GRACE_S) -> str:
    """SIGTERM the broker's process group, wait until it is gone, SIGKILL it after ``grace_s``.

    Returning only once the JVM has exited means a ``kafka-up`` right after finds the port free.
    """
    def alive() -> bool:  # a zombie holds no port: only running members count
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, psutil.Error):
                continue
        return False

    if not alive():
        return "was not running"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not alive():
        return "exited on SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    while alive():
        time.sleep(0.05)
    return f"killed after {grace_s:g} s"


def _state_dir() -> Path:
    return cache_dir() / "kafka" / "local"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m foreshock.ingest.kafka_local")
    parser.add_argument("action", choices=["up", "down", "fetch"])
    parser.add_argument("--port", type=int, default=9092)
    args = parser.parse_args(argv)
    state = _state_dir()
    if args.action == "fetch":
        print(fetch_jars())
        return 0
    pid_file = state / "broker.pid"
    if args.action == "down":
        if pid_file.exists():
            how = stop_process_group(int(pid_file.read_text()))
            pid_file.unlink()
            print(f"Kafka broker stopped ({how})")
        else:
            print("no Kafka broker running")
        return 0
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 0)
            print((state / "bootstrap").read_text().strip())
            return 0
        except (ProcessLookupError, FileNotFoundError, ValueError):
            pid_file.unlink()
    broker = LocalKafka(data_dir=state, port=args.port).start()
    (state / "bootstrap").write_text(broker.bootstrap + "\n")
    print(broker.bootstrap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
