"""The mitigator on a real Kafka broker: the ``foreshock mitigate`` CLI and the topic command channel."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from foreshock.ingest.contract import RiskScore, Topic, decode
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.channels import Command, TopicChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def read_all(bootstrap: str, group: str, topic: str, expect: int, timeout_s: float = 30) -> list:
    bus = KafkaBus(bootstrap)
    consumer = bus.consumer(group, [topic])
    out: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for m in consumer.poll(1.0):
                out.extend(decode(topic, m.value))
    finally:
        consumer.close()
        bus.close()
    return out


def test_cli_dry_run_records_what_it_would_do_and_touches_nothing(kafka_bootstrap, group_id, tmp_path):
    bus = KafkaBus(kafka_bootstrap)
    t0 = now_ms()
    publish(
        bus,
        [
            RiskScore(node="gpu-7", ts=t0 + i, probability=p, alert=p >= 0.8, threshold=0.8)
            for i, p in enumerate([0.5, 0.9, 0.95])
        ],
    )
    bus.flush()
    bus.close()
    audit = tmp_path / "audit.sqlite"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "foreshock",
            "mitigate", "--metrics-port", "0",
            "--kafka",
            kafka_bootstrap,
            "--scheduler",
            "none",
            "--dry-run",
            "--audit",
            str(audit),
            "--group",
            group_id,
            "--run-for",
            "12s",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sqlite3.connect(audit).execute("SELECT action, status, dry_run FROM mitigation_events").fetchall()
    assert rows == [("drain", "planned", 1), ("drain", "skipped", 1)]
    events = [
        e for e in read_all(kafka_bootstrap, group_id + "-reader", Topic.MITIGATION, 2) if e.node == "gpu-7"
    ]
    assert [(e.action, e.status, e.dry_run) for e in events] == [
        ("drain", "planned", True),
        ("drain", "skipped", True),
    ]


def test_topic_channel_carries_commands_to_the_job_and_acks_back(kafka_bootstrap):
    mitigator_side = TopicChannel(KafkaBus(kafka_bootstrap), group="mitigator-acks")
    hook_side = TopicChannel(KafkaBus(kafka_bootstrap), group="hook-job-a")
    other_job = TopicChannel(KafkaBus(kafka_bootstrap), group="hook-job-b")
    try:
        cmd = Command("migrate:gpu-3:job-a:1", "job-a", "leave", "gpu-3", now_ms())
        mitigator_side.send(cmd)
        mitigator_side.send(cmd)  # a retried send: delivered once to the hook
        received: list[Command] = []
        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline:
            received = hook_side.poll("job-a")
            time.sleep(0.2)
        assert received == [cmd]
        assert hook_side.poll("job-a") == []
        assert other_job.poll("job-b") == []
        hook_side.ack(cmd, "snapshot durable at step 120")
        assert mitigator_side.wait(cmd, 30) == "snapshot durable at step 120"
    finally:
        for ch in (mitigator_side, hook_side, other_job):
            ch.close()
            ch.bus.close()
