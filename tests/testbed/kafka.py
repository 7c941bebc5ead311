"""A single-node Kafka broker in KRaft mode on loopback, from Maven Central jars."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from .build import ensure
from .procs import LOOPBACK, ManagedProcess, free_port

LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=WARN
log4j.logger.org.apache.kafka=WARN
"""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise FileNotFoundError("java is not installed: the Kafka broker needs a Java 17 runtime")
    return found


@dataclass
class KafkaBroker:
    workdir: Path
    port: int = 0
    proc: ManagedProcess | None = None
    # Where clients connect: loopback, or with real nodes the host address their pods reach
    # (only that address; the controller listener stays on loopback).
    host: str = LOOPBACK

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def _java(self, main: str, *args: str) -> list[str]:
        lib = ensure("kafka").path("lib")
        return [
            java(),
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp",
            f"{lib}/*",
            main,
            *args,
        ]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        controller = free_port()
        (self.workdir / "log4j.properties").write_text(LOG4J)
        props = self.workdir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@{LOOPBACK}:{controller}",
                    f"listeners=PLAINTEXT://{self.host}:{self.port},"
                    f"CONTROLLER://{LOOPBACK}:{controller}",
                    f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "num.partitions=4",
                    "auto.create.topics.enable=false",
                    f"log.dirs={self.workdir / 'data'}",
                ]
            )
            + "\n"
        )
        formatter = ManagedProcess(
            "kafka-format",
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                "-t",
                "c3RhdG9yLXRlc3RiZWQtMQ",
                "-c",
                str(props),
            ),
            self.workdir,
        ).start()
        assert formatter.proc is not None
        if formatter.proc.wait(120) != 0:
            raise RuntimeError(f"formatting Kafka storage failed; see {formatter.log}")
        self.proc = ManagedProcess(
            "kafka", self._java("kafka.Kafka", str(props)), self.workdir
        ).start()

        def accepting() -> bool:
            with socket.create_connection((self.host, self.port), timeout=1):
                return self._metadata_ready()

        try:
            self.proc.wait_ready(accepting, timeout, "accepting clients")
        except BaseException:
            self.stop()
            raise
        return self

    def _metadata_ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(timeout=2)
        return md.brokers is not None and len(md.brokers) == 1

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace=15)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
