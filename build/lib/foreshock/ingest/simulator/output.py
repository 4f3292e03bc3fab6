"""Where simulated telemetry goes: a dataset folder (batch) or a bus (stream).

Both take the same chunks, so a dataset and a stream of the same run hold the same records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from foreshock.ingest.bus import Bus
from foreshock.ingest.contract import GpuSample, LinkSample, NodeEvent, XidEvent
from foreshock.ingest.dataset import DatasetWriter
from foreshock.ingest.simulator.engine import Chunk, Simulator
from foreshock.ingest.stream import publish

__all__ = ["write_dataset", "stream", "node_events", "DEFAULT_PART_ROWS"]

DEFAULT_PART_ROWS = 1 << 20
"""GPU rows per parquet part (about 1M: tens of MB on disk, a few seconds to read)."""


def write_dataset(
    sim: Simulator,
    directory: str | Path,
    *,
    overwrite: bool = False,
    part_rows: int = DEFAULT_PART_ROWS,
    on_chunk: Callable[[Chunk], None] | None = None,
) -> Path:
    """Write the whole run as a dataset folder; the manifest goes last.

    Chunks are row groups; a part (the same time span in every table) closes once its GPU
    table holds ``part_rows`` rows. ``on_chunk`` is called after each chunk (progress bars).
    Parquet encoding of chunk i overlaps the generation of chunk i+1 (one writer thread, so
    parts are written in order and the bytes do not change); memory holds two chunks.
    """
    writer = DatasetWriter(directory, overwrite=overwrite)
    rows = 0

    def write(chunk: Chunk) -> None:
        nonlocal rows
        writer.write_part("gpu", chunk.gpu)
        writer.write_part("xid", chunk.xid)
        writer.write_part("link", chunk.link)
        rows += chunk.gpu.num_rows
        if rows >= part_rows:
            writer.end_part()
            rows = 0

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataset-writer") as pool:
        pending: tuple[Future, Chunk] | None = None
        for chunk in sim.chunks():
            if pending is not None:
                _finish(pending, on_chunk)
            pending = (pool.submit(write, chunk), chunk)
        if pending is not None:
            _finish(pending, on_chunk)
    writer.write_events(sim.events_table())
    writer.write_ground_truth(sim.ground_truth_table())
    writer.write_manifest(sim.manifest())
    return Path(directory)


def _finish(pending: tuple[Future, Chunk], on_chunk: Callable[[Chunk], None] | None) -> None:
    future, chunk = pending
    future.result()
    if on_chunk is not None:
        on_chunk(chunk)


def node_events(sim: Simulator) -> list[NodeEvent]:
    """The run's lifecycle events (ground truth) as contract records, in time order."""
    return [
        NodeEvent(**{k: v for k, v in row.items() if v is not None}) for row in sim.events_table().to_pylist()
    ]


def _rows_by_ts(table: pa.Table) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(ts, rows at that ts) in time order, from a table sorted by ts."""
    if table.num_rows == 0:
        return
    ts = table.column("ts").to_numpy()
    bounds = np.flatnonzero(np.diff(ts)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [ts.size]])
    for a, b in zip(starts, ends, strict=True):
        yield int(ts[a]), table.slice(a, b - a).to_pylist()


def _records(cls: type, rows: list[dict[str, Any]]) -> list[Any]:
    return [cls(**{k: v for k, v in row.items() if v is not None}) for row in rows]


def stream(
    sim: Simulator,
    bus: Bus,
    *,
    speed: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_step: Callable[[int], None] | None = None,
) -> int:
    """Publish the run onto ``bus`` instant by instant; returns the number of messages sent.

    Each sampling instant sends one message per node per topic (all of a node's GPUs or ports
    together), Xids and node lifecycle events (the ground truth, on ``node.events``) at the
    instant they belong to. ``speed`` is simulated seconds per real second (60: a minute per
    second); ``None`` sends as fast as the bus takes it. ``clock``/``sleep`` are injectable.
    """
    events = node_events(sim)
    next_event = 0
    sent = 0
    t0 = clock()
    for chunk in sim.chunks():
        xids = _records(XidEvent, chunk.xid.to_pylist())
        next_xid = 0
        links = dict(_rows_by_ts(chunk.link))
        for ts, gpu_rows in _rows_by_ts(chunk.gpu):
            if speed is not None:
                wait = t0 + (ts - sim.start_ms) / 1000 / speed - clock()
                if wait > 0:
                    sleep(wait)
            records: list[Any] = []
            while next_event < len(events) and events[next_event].ts <= ts:
                records.append(events[next_event])
                next_event += 1
            while next_xid < len(xids) and xids[next_xid].ts <= ts:
                records.append(xids[next_xid])
                next_xid += 1
            records += _records(GpuSample, gpu_rows)
            records += _records(LinkSample, links.get(ts, []))
            sent += publish(bus, records)
            if on_step is not None:
                on_step(ts)
        sent += publish(bus, xids[next_xid:])
    sent += publish(bus, events[next_event:])
    bus.flush()
    return sent
