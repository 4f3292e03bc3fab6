"""Connecting a command to Kafka: one sentence, not a traceback, when the broker is unreachable."""

from __future__ import annotations

from collections.abc import Sequence

import typer

from foreshock.ingest.contract import Topic


def connect_kafka(
    bootstrap: str, command: str, topics: Sequence[str] = Topic.ALL, client_id: str | None = None,
    producer_config: dict | None = None,
):
    """Create any missing ``topics`` and return a KafkaBus; exit 1, in one sentence, if unreachable.

    ``producer_config`` overrides the bus's producer settings (a collector passes
    :data:`foreshock.ingest.kafka_bus.BOUNDED_PRODUCER`)."""
    from kafka.errors import KafkaError

    from foreshock.ingest.kafka_bus import KafkaBus, ensure_topics

    try:
        ensure_topics(bootstrap, topics)
    except KafkaError as exc:
        typer.echo(f"foreshock {command}: cannot reach Kafka at {bootstrap} ({exc}).", err=True)
        raise typer.Exit(1) from None
    return KafkaBus(bootstrap, client_id=client_id or f"foreshock-{command}", producer_config=producer_config)
