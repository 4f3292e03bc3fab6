"""The online engine equals the batch engine, feature by feature, on random disordered streams.

Streams have random gaps, arrivals out of order by up to the engine's tolerance, counter
resets, missing fields, duplicate records (with different values: the last received wins) and
Xid/link records and node returns to service (which cut windows), fed in random micro-batches
through both update paths. The feature sets enumerate the aggregation registry, so a new
aggregation is covered without a new test.
Also: save/restore mid-stream gives identical results, and late records are counted and dropped.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from foreshock.features import DEFAULT_FEATURE_SET, Feature, FeatureSet, PeerFeature
from foreshock.features.batch import compute_features
from foreshock.features.default_set import XID_CLASSES
from foreshock.features.kernels import AGGREGATIONS
from foreshock.features.online import FloatSpace, OnlineFeatureEngine, _read_arrays
from foreshock.features.spec import GPU_COUNTERS
from foreshock.ingest.contract import GpuSample, LinkSample, NodeEvent, XidEvent, partition_of

M = 60_000
T0 = 1_767_225_600_000  # 2026-01-01
GAUGES = ("gpu_temp", "power_usage", "clocks_event_reasons")
COUNTERS = ("ecc_sbe_vol_total", "pcie_replay_counter")
LINKS = ("symbol_error", "link_downed")
_FIELD_FOR_KIND = {
    "gauge": ("gpu", GAUGES),
    "counter": ("gpu", COUNTERS),
    "xid": ("xid", ("memory", "other")),
    "link_counter": ("link", LINKS),
    "link_state": ("link", ("state",)),
    "node_event": ("node", ("failed", "returned")),
}


def registry_feature_set(bucket_ms: int = M) -> FeatureSet:
    """Every aggregation of the registry, on every kind it applies to, over short windows; peers in
    two groups, so that the random streams' few nodes share one."""
    feats = []
    for name, agg in AGGREGATIONS.items():
        for kind in sorted(agg.kinds):
            source, fields = _FIELD_FOR_KIND[kind]
            for field in fields:
                for w in (1, 3, 7):
                    thr = (0.0 if field != "gpu_temp" else 60.0) if agg.needs_threshold else None
                    feats.append(Feature(source, field, name, w * M, thr))
    by = {f.name: f for f in feats}
    peers = (
        PeerFeature(by["gpu_temp__max__3m"], "z"),
        PeerFeature(by["gpu_temp__mean__7m"], "rank"),
        PeerFeature(by["ecc_sbe_vol_total__increase__7m"], "z"),
    )
    return FeatureSet(tuple(feats), peers, XID_CLASSES, bucket_ms=bucket_ms, live_ms=3 * M, peer_partitions=2)


REGISTRY_SET = registry_feature_set()
SETS = {
    "default": DEFAULT_FEATURE_SET,
    "registry": REGISTRY_SET,
    "registry_30s_buckets": registry_feature_set(30_000),
}


def make_stream(seed: int, tolerance_ms: int) -> tuple[dict[str, pd.DataFrame], np.ndarray]:
    """Frames (in arrival order) and each row's arrival key, for a random small cluster."""
    rng = np.random.default_rng(seed)
    nodes = [f"node{i:04d}" for i in rng.choice(50, size=int(rng.integers(1, 5)), replace=False)]
    gpus = int(rng.integers(1, 4))
    interval = int(rng.choice([7_000, 20_000, 30_000, 45_000, 70_000]))
    steps = int(rng.integers(5, 80))
    start = T0 + int(rng.integers(0, 5 * M))
    frames = {}
    rows = []
    for n in nodes:
        base = rng.normal(60, 8)
        counters = rng.integers(0, 1000, size=(gpus, len(COUNTERS)))
        for k in range(steps):
            if rng.random() < 0.15:  # gap
                continue
            ts = start + k * interval + int(rng.integers(0, 1000))
            for g in range(gpus):
                counters[g] += rng.poisson(0.7, len(COUNTERS))
                if rng.random() < 0.03:  # reset
                    counters[g] = rng.integers(0, 3, len(COUNTERS))
                row = {
                    "node": n,
                    "ts": ts,
                    "gpu": g,
                    "gpu_temp": base + rng.normal(0, 3) + 0.1 * k,
                    "power_usage": float(rng.normal(400, 50)),
                    "clocks_event_reasons": float(rng.choice([0, 0, 4])),
                }
                row.update({c: float(v) for c, v in zip(COUNTERS, counters[g], strict=True)})
                for f in (*GAUGES, *COUNTERS):
                    if rng.random() < 0.1:  # missing field
                        row[f] = math.nan
                rows.append(row)
                if rng.random() < 0.05:  # duplicate, possibly with other values
                    dup = dict(row)
                    dup["gpu_temp"] = dup["gpu_temp"] + float(rng.choice([0.0, 1.5]))
                    rows.append(dup)
    frames["gpu"] = pd.DataFrame(rows)
    span = (start, start + steps * interval)
    n_xid = int(rng.integers(0, 12))
    codes = [48, 63, 74, 79, 13, 119, 999, 31]
    frames["xid"] = pd.DataFrame(
        {
            "node": rng.choice(nodes, n_xid),
            "ts": rng.integers(*span, n_xid),
            "xid": rng.choice(codes, n_xid),
            "gpu": rng.integers(0, gpus, n_xid),
            "count": rng.integers(1, 4, n_xid),
        }
    )
    link_rows = []
    for n in nodes:
        values = rng.integers(0, 50, size=(2, len(LINKS)))
        for k in range(0, steps, 2):
            for p, port in enumerate(("mlx5_0/1", "mlx5_1/1")):
                if rng.random() < 0.2:
                    continue
                values[p] += rng.poisson(0.5, len(LINKS))
                if rng.random() < 0.05:
                    values[p] = 0
                row = {
                    "node": n,
                    "ts": start + k * interval + p,
                    "port": port,
                    "kind": "ib",
                    "state": rng.choice(["4: ACTIVE", "4: ACTIVE", "1: DOWN", None]),
                }
                row.update(
                    {
                        c: float(v) if rng.random() > 0.1 else math.nan
                        for c, v in zip(LINKS, values[p], strict=True)
                    }
                )
                link_rows.append(row)
    frames["link"] = pd.DataFrame(link_rows)
    n_events = int(rng.integers(0, 6))  # returns cut windows, history features count failures
    frames["events"] = pd.DataFrame(
        {
            "node": rng.choice(nodes, n_events).astype(object),
            "ts": rng.integers(*span, n_events),
            "event": rng.choice(["repaired", "up", "failed", "down", "drained"], n_events).astype(object),
        }
    )
    arrival = {}
    for kind, df in frames.items():  # arrival = ts + jitter < tolerance: disorder bounded by it
        jitter = (
            rng.integers(0, tolerance_ms + 1, len(df)) if tolerance_ms else np.zeros(len(df), dtype=np.int64)
        )
        key = df["ts"].to_numpy() + np.minimum(jitter, max(tolerance_ms - 1, 0))
        order = np.argsort(key, kind="stable")
        frames[kind] = df.iloc[order].reset_index(drop=True)
        arrival[kind] = key[order]
    return frames, arrival


def _records(kind: str, df: pd.DataFrame) -> list:
    out = []
    for row in df.to_dict("records"):
        clean = {
            k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v)) and v is not None
        }
        if kind == "gpu":
            clean.update({c: int(clean[c]) for c in GPU_COUNTERS if c in clean})
            out.append(GpuSample(**{k: v for k, v in clean.items()}))
        elif kind == "xid":
            out.append(XidEvent(**{k: int(v) if k != "node" else v for k, v in clean.items()}))
        elif kind == "events":
            out.append(NodeEvent(node=clean["node"], ts=int(clean["ts"]), event=clean["event"]))
        else:
            clean.update({c: int(clean[c]) for c in LINKS if c in clean})
            out.append(LinkSample(**clean))
    return out


def assert_same(online: pd.DataFrame, batch: pd.DataFrame, names: list[str], where: str) -> None:
    assert list(online.columns) == ["node", "ts", *names]
    assert online["node"].tolist() == batch["node"].tolist(), where
    a, b = online[names].to_numpy(np.float64), batch[names].to_numpy(np.float64)
    ok = np.isclose(a, b, rtol=1e-9, atol=0.0, equal_nan=True)
    bad = [
        f"{n}: online {a[~ok[:, j], j]} != batch {b[~ok[:, j], j]}"
        for j, n in enumerate(names)
        if not ok[:, j].all()
    ]
    assert not bad, f"{where}: " + "; ".join(bad)


def feed(engine: OnlineFeatureEngine, frames, arrival, lo: int, hi: int, use_records: bool) -> None:
    """Feed every record whose arrival key is in [lo, hi) in arrival order: one ``update`` call, or
    one ``update_frame`` call per run of same-kind records."""
    parts = [
        (arrival[k][(arrival[k] >= lo) & (arrival[k] < hi)], k, df[(arrival[k] >= lo) & (arrival[k] < hi)])
        for k, df in frames.items()
    ]
    if use_records:
        engine.update([r for _, kind, part in parts for r in _records(kind, part)])
        return
    keys = np.concatenate([a for a, _, _ in parts])
    if not len(keys):
        return
    kinds = np.concatenate([np.full(len(a), i) for i, (a, _, _) in enumerate(parts)])
    rows = np.concatenate([np.arange(len(a)) for a, _, _ in parts])
    order = np.argsort(keys, kind="stable")
    kinds, rows = kinds[order], rows[order]
    cuts = np.flatnonzero(np.r_[True, kinds[1:] != kinds[:-1], True])
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        _, kind, part = parts[kinds[a]]
        engine.update_frame(kind, part.iloc[rows[a:b]])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    seed=st.integers(0, 2**31),
    tolerance=st.sampled_from([0, 15_000, 60_000, 150_000]),
    batch_ms=st.sampled_from([5_000, 60_000, 400_000]),
    use_records=st.booleans(),
    which=st.sampled_from(sorted(SETS)),
    by_job=st.booleans(),
)
def test_online_equals_batch_on_random_streams(seed, tolerance, batch_ms, use_records, which, by_job):
    fs = SETS[which]
    frames, arrival = make_stream(seed, tolerance)
    nodes = sorted(frames["gpu"]["node"].unique())
    jobs = {n: f"job{i % 2}" for i, n in enumerate(nodes[1:])} if by_job else None  # nodes[0]: no job
    batch = compute_features(
        gpu=frames["gpu"],
        xid=frames["xid"],
        link=frames["link"],
        events=frames["events"],
        feature_set=fs,
        peer_groups=jobs,
    )
    engine = OnlineFeatureEngine(fs, tolerance_ms=tolerance, history_ms=10 * M)
    rng = np.random.default_rng(seed + 1)
    first = min(int(a.min()) for a in arrival.values() if len(a))
    last = max(int(a.max()) for a in arrival.values() if len(a)) + 1
    ticks = batch["ts"].unique()
    starts = range(first, last, batch_ms)
    for lo in starts:
        feed(engine, frames, arrival, lo, lo + batch_ms, use_records)
        settled = engine.watermark_ms - tolerance  # every record up to here has arrived
        # a tick whose records have all arrived, and that the engine still holds (history_ms)
        ready = ticks[(ticks <= settled) & (ticks >= settled - engine.history_ms + fs.bucket_ms)]
        if len(ready) and rng.random() < 8 / len(starts):
            t = int(rng.choice(ready[-8:]))
            assert_same(
                engine.features_at(t, peer_groups=jobs),
                batch[batch["ts"] == t].reset_index(drop=True),
                fs.names,
                f"t={t}",
            )
    for t in ticks[-3:]:  # everything has arrived: even still-open buckets must agree
        assert_same(
            engine.features_at(int(t), peer_groups=jobs),
            batch[batch["ts"] == t].reset_index(drop=True),
            fs.names,
            f"end t={t}",
        )
    assert engine.late_records == 0


def _span(arrival) -> tuple[int, int]:
    """The first arrival key of a stream and one past its last."""
    keys = [a for a in arrival.values() if len(a)]
    return min(int(a.min()) for a in keys), max(int(a.max()) for a in keys) + 1


def _assert_continue_alike(straight, restored, frames, arrival, mid: int, last: int) -> None:
    """Feed both engines the rest of the stream from ``mid``; they answer alike all along."""
    for lo in range(mid, last, 30_000):
        feed(straight, frames, arrival, lo, lo + 30_000, False)
        feed(restored, frames, arrival, lo, lo + 30_000, False)
        t = (lo // M) * M
        pd.testing.assert_frame_equal(straight.features_at(t), restored.features_at(t))
    t = (last // M + 1) * M
    assert len(straight.features_at(t))
    pd.testing.assert_frame_equal(straight.features_at(t), restored.features_at(t))


def test_save_and_restore_continue_exactly(tmp_path):
    fs = REGISTRY_SET
    frames, arrival = make_stream(7, 60_000)
    first, last = _span(arrival)
    mid = (first + last) // 2
    straight = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    stopped = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    feed(straight, frames, arrival, first, mid, False)
    feed(stopped, frames, arrival, first, mid, False)
    stopped.save(tmp_path / "state")
    restored = OnlineFeatureEngine.load(tmp_path / "state", fs)
    assert restored.state_bytes() <= stopped.state_bytes()
    assert restored.nodes() == stopped.nodes()
    _assert_continue_alike(straight, restored, frames, arrival, mid, last)


def test_snapshot_saved_after_the_engine_moved_on_restores_its_moment(tmp_path):
    """What a background checkpoint does: snapshot, feed the engine on, then save the snapshot.
    The engine goes on for longer than its shortest rings hold, so it writes over every slot."""
    fs = REGISTRY_SET
    frames, arrival = make_stream(18, 60_000)
    first, last = _span(arrival)
    mid = first + 20 * M
    assert last - mid > 2 * min(OnlineFeatureEngine(fs)._rings) * M
    straight = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    live = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    feed(straight, frames, arrival, first, mid, False)
    feed(live, frames, arrival, first, mid, False)
    live.features_at(mid)  # the open buckets' statistics exist, as on a scoring loop
    snapshot = live.snapshot()
    feed(live, frames, arrival, mid, last, False)  # rings, carries and pending all move on
    live.features_at(last)
    snapshot.save(tmp_path / "state")
    restored = OnlineFeatureEngine.load(tmp_path / "state", fs)
    _assert_continue_alike(straight, restored, frames, arrival, mid, last)
    t = (last // M + 1) * M
    pd.testing.assert_frame_equal(live.features_at(t), restored.features_at(t))


def test_snapshots_laid_in_one_space_save_what_the_engine_saves(tmp_path):
    """The risk service lays each partition's snapshot in one space, reused once the previous
    snapshot is written: the saved state is byte for byte the engine's own, the rings lie in the
    space, and a later snapshot of another engine, larger or smaller, takes it over."""
    fs = REGISTRY_SET
    space = FloatSpace()
    for seed in (11, 18, 5):  # 1, 4 and 3 nodes: the space grows, then serves a smaller engine
        frames, arrival = make_stream(seed, 60_000)
        first, last = _span(arrival)
        engine = OnlineFeatureEngine(fs, tolerance_ms=60_000)
        feed(engine, frames, arrival, first, (first + last) // 2, False)
        engine.features_at((first + last) // 2)
        laid = engine.snapshot(space)
        used = space.take(sum(ring.size for ring in laid._rings.values()))
        assert all(np.shares_memory(ring, used) for ring in laid._rings.values())
        laid.save(tmp_path / "laid")
        engine.save(tmp_path / "live")
        assert (tmp_path / "laid").read_bytes() == (tmp_path / "live").read_bytes()


def test_a_state_saved_as_npz_still_restores(tmp_path):
    fs = REGISTRY_SET
    frames, arrival = make_stream(7, 60_000)
    _, last = _span(arrival)
    engine = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    feed(engine, frames, arrival, 0, last, False)
    engine.save(tmp_path / "state")
    assert (tmp_path / "state").read_bytes()[:4] != b"PK\x03\x04"
    with open(tmp_path / "state.npz", "wb") as fh:
        np.savez(fh, **_read_arrays(tmp_path / "state"))
    t = (last // M + 1) * M
    for saved in ("state", "state.npz"):
        restored = OnlineFeatureEngine.load(tmp_path / saved, fs)
        pd.testing.assert_frame_equal(engine.features_at(t), restored.features_at(t))
    (tmp_path / "junk").write_bytes(b"not a state at all")
    with pytest.raises(ValueError, match="not an online feature state"):
        OnlineFeatureEngine.load(tmp_path / "junk", fs)


def test_restore_refuses_another_feature_set(tmp_path):
    engine = OnlineFeatureEngine(REGISTRY_SET)
    engine.save(tmp_path / "s.npz")
    with pytest.raises(ValueError, match="feature set"):
        OnlineFeatureEngine.load(tmp_path / "s.npz", DEFAULT_FEATURE_SET)


def test_late_records_are_counted_and_dropped():
    fs = DEFAULT_FEATURE_SET.select(["gpu_temp__max__30m"])
    engine = OnlineFeatureEngine(fs, tolerance_ms=0)
    engine.update_frame("gpu", pd.DataFrame({"node": ["a"], "ts": [T0], "gpu": [0], "gpu_temp": [50.0]}))
    engine.update_frame(
        "gpu", pd.DataFrame({"node": ["a"], "ts": [T0 + 5 * M], "gpu": [0], "gpu_temp": [51.0]})
    )
    engine.update_frame("gpu", pd.DataFrame({"node": ["a"], "ts": [T0 + M], "gpu": [0], "gpu_temp": [99.0]}))
    assert engine.late_records == 1
    assert engine.features_at(T0 + 6 * M)["gpu_temp__max__30m"].tolist() == [51.0]


def test_peer_features_compare_within_the_group():
    frames, _ = make_stream(2, 0)
    nodes = sorted(frames["gpu"]["node"].unique())
    fs = REGISTRY_SET
    alone = {nodes[0]: "solo", **{n: "big" for n in nodes[1:]}}
    table = compute_features(gpu=frames["gpu"], feature_set=fs, peer_groups=alone)
    cluster = compute_features(gpu=frames["gpu"], feature_set=fs)
    solo = table[table["node"] == nodes[0]]
    assert len(solo) and (solo["peer_rank__gpu_temp__mean__7m"].dropna() == 1.0).all()
    assert (solo["peer_z__gpu_temp__max__3m"].dropna() == 0.0).all()
    assert len(nodes) > 2, "seed 2 has several nodes"
    assert not table["peer_z__gpu_temp__max__3m"].equals(cluster["peer_z__gpu_temp__max__3m"])


def test_an_engine_fed_one_partition_answers_for_its_nodes_as_one_fed_every_partition():
    """The risk service runs one engine per partition: the peers of a node are its partition's nodes,
    so that engine's rows equal those of an engine that holds the whole cluster (and the batch
    engine's), and differ from a comparison with the whole cluster."""
    fs = REGISTRY_SET
    frames, arrival = make_stream(3, 60_000)
    nodes = sorted(frames["gpu"]["node"].unique())
    group = {n: partition_of(n, fs.peer_partitions) for n in nodes}
    assert sorted(group.values()) == [0, 0, 1, 1], "seed 3: two groups of two nodes"
    first = min(int(a.min()) for a in arrival.values() if len(a))
    last = max(int(a.max()) for a in arrival.values() if len(a)) + 1
    whole = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    feed(whole, frames, arrival, first, last, False)
    t = (last // M) * M
    everyone = whole.features_at(t)
    for g in (0, 1):
        mine = [n for n in nodes if group[n] == g]
        kept = {k: df[df["node"].isin(mine)].reset_index(drop=True) for k, df in frames.items()}
        engine = OnlineFeatureEngine(fs, tolerance_ms=60_000)
        feed(engine, kept, {k: arrival[k][frames[k]["node"].isin(mine).to_numpy()] for k in frames},
             first, last, False)
        expect = everyone[everyone["node"].isin(mine)].reset_index(drop=True)
        assert len(expect) == 2
        pd.testing.assert_frame_equal(engine.features_at(t), expect)
    cluster = OnlineFeatureEngine(dataclasses.replace(fs, peer_partitions=1), tolerance_ms=60_000)
    feed(cluster, frames, arrival, first, last, False)
    peers = [p.name for p in fs.peers]
    assert not cluster.features_at(t)[peers].equals(everyone[peers])
