"""The local broker's class archive: written by a broker that stops cleanly, mapped by later starts,
and thrown away when a JVM cannot map it (a cut-short archive crashes every JVM that maps it)."""

from __future__ import annotations

import pytest

from foreshock.ingest import kafka_local
from foreshock.ingest.contract import Topic
from foreshock.ingest.kafka_bus import ensure_topics
from foreshock.ingest.kafka_local import LocalKafka

pytestmark = pytest.mark.integration


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """This test's own archive path, so that the jar cache's archive is neither used nor replaced."""
    path = tmp_path / "classes.jsa"
    monkeypatch.setattr(kafka_local, "class_archive", lambda libs: path)
    return path


def test_a_clean_stop_leaves_a_class_archive_that_the_next_start_maps(tmp_path, archive):
    first = LocalKafka(data_dir=tmp_path / "first", quick_start=True).start()
    assert f"-XX:ArchiveClassesAtExit={first.data_dir / 'classes.jsa.partial'}" in first.process.args
    first.stop()
    assert archive.stat().st_size > 1 << 20
    assert not (first.data_dir / "classes.jsa.partial").exists()

    second = LocalKafka(data_dir=tmp_path / "second", quick_start=True).start()
    try:
        assert f"-XX:SharedArchiveFile={archive}" in second.process.args
        assert not any(a.startswith("-XX:ArchiveClassesAtExit") for a in second.process.args)
        ensure_topics(second.bootstrap, [Topic.GPU], partitions=2)  # and it serves
    finally:
        second.stop()
    log = (second.data_dir / "broker.log").read_text(errors="replace")
    assert "Kafka Server started" in log and "[cds" not in log  # where a JVM warns of an archive


def test_an_archive_a_jvm_cannot_map_is_thrown_away(tmp_path, archive):
    broker = LocalKafka(data_dir=tmp_path / "broker")
    broker.data_dir.mkdir()
    partial = broker.data_dir / "classes.jsa.partial"
    partial.write_bytes(b"\0" * 65536)  # what a JVM killed while writing it leaves
    broker.stop()
    assert not archive.exists() and not partial.exists()


def test_without_class_sharing_a_broker_neither_maps_nor_writes_an_archive(tmp_path, archive):
    broker = LocalKafka(data_dir=tmp_path / "plain", class_sharing=False).start()
    try:
        assert not any("SharedArchiveFile" in a or "ArchiveClassesAtExit" in a for a in broker.process.args)
    finally:
        broker.stop()
    assert not archive.exists()
