"""The open buckets' statistics, kept current update by update, equal one fold of the same records.

The online engine folds each update's records into the still-open buckets
(:class:`foreshock.features.buckets.PartialBuckets`) instead of bucketing those again at every read. The
tests below require that to change nothing, bit for bit: folding a stream in many pieces gives
the statistics (and counter carry) of one fold; a record that would make a fold inexact (older
than, or a duplicate of, one already folded for its node) is refused; and an engine fed random
disordered streams (out-of-order records within the tolerance, duplicates, counter resets, Xid
and link records) in small micro-batches, read between them, answers exactly as an engine
restored from the same state, which folds every pending record at once, and, where every record
has arrived, as the batch engine. Some tests also look at the engine's private ``_open`` to make
sure the incremental path is the one taken (in order) or left (out of order).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.features.batch import compute_features
from foreshock.features.buckets import Carry, PartialBuckets, bucketize, carry_past, gpu_columns
from foreshock.features.frames import KINDS, Codes, to_columns
from foreshock.features.online import OnlineFeatureEngine
from tests.unit.test_features_parity import SETS, T0, M, assert_same, feed, make_stream


def _columns(frames: dict[str, pd.DataFrame], fs) -> dict[str, dict[str, np.ndarray]]:
    nodes, ports = Codes(), Codes()
    return {kind: to_columns(kind, frames[kind], fs, nodes, ports) for kind in KINDS if len(frames[kind])}


def _rows(cols: dict[str, np.ndarray] | None, keep: np.ndarray) -> dict[str, np.ndarray] | None:
    return None if cols is None else {k: v[keep] for k, v in cols.items()}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), which=st.sampled_from(sorted(SETS)), pieces=st.integers(2, 40))
def test_folding_in_pieces_equals_one_fold(seed, which, pieces):
    fs = SETS[which]
    frames, _ = make_stream(seed, 0)
    cols = _columns(frames, fs)
    every = [cols.get(kind) for kind in KINDS]
    once_carry = Carry()
    once = bucketize(fs, *every, once_carry)

    ts = np.concatenate([c["ts"] for c in cols.values()])
    cuts = np.unique(np.random.default_rng(seed).choice(np.unique(ts), size=pieces - 1))
    partial = PartialBuckets(fs, Carry())
    for lo, hi in zip(np.r_[ts.min(), cuts], np.r_[cuts, ts.max() + 1], strict=True):
        piece = [_rows(c, (c["ts"] >= lo) & (c["ts"] < hi)) if c is not None else None for c in every]
        assert partial.follows(*piece)
        partial.fold(*piece)
    table = partial.table
    np.testing.assert_array_equal(table.node, once.node)
    np.testing.assert_array_equal(table.bucket, once.bucket)
    np.testing.assert_array_equal(table.values, once.values)  # bit for bit, NaN where NaN
    np.testing.assert_array_equal(partial.carry.gpu, once_carry.gpu)
    np.testing.assert_array_equal(partial.carry.link, once_carry.link)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), which=st.sampled_from(sorted(SETS)), chunks=st.integers(1, 6))
def test_carrying_past_records_leaves_the_carry_a_fold_leaves(seed, which, chunks):
    """The online engine moves the carry past the records of buckets it closes without folding
    them again (their statistics are in the open buckets): in any order and any chunks, with
    duplicates whose counters differ or are missing, the carry is the one a fold leaves."""
    fs = SETS[which]
    rng = np.random.default_rng(seed)
    frames, _ = make_stream(seed, 0)
    cols = _columns(frames, fs)
    for kind in ("gpu", "link"):
        if kind not in cols:
            continue
        c = cols[kind]
        dup = rng.choice(len(c["ts"]), size=len(c["ts"]) // 5)
        extra = {k: v[dup].copy() for k, v in c.items()}
        for v in extra.values():
            if v.dtype.kind == "f":
                v[rng.random(len(v)) < 0.5] = np.nan
                v += rng.integers(0, 2, len(v))
        shuffled = rng.permutation(len(c["ts"]) + len(dup))
        cols[kind] = {k: np.r_[c[k], extra[k]][shuffled] for k in c}
    folded = Carry()
    bucketize(fs, cols.get("gpu"), cols.get("xid"), cols.get("link"), folded)
    moved = Carry()

    def pieces(c: dict[str, np.ndarray] | None) -> list[dict[str, np.ndarray]]:
        if c is None:
            return []
        cuts = np.sort(rng.integers(0, len(c["ts"]) + 1, chunks - 1))
        spans = zip(np.r_[0, cuts], np.r_[cuts, len(c["ts"])], strict=True)
        return [{k: v[lo:hi] for k, v in c.items()} for lo, hi in spans]

    carry_past(fs, pieces(cols.get("gpu")), pieces(cols.get("link")), moved)
    np.testing.assert_array_equal(moved.gpu, folded.gpu)
    np.testing.assert_array_equal(moved.link, folded.link)


def test_follows_refuses_records_a_fold_would_get_wrong():
    fs = SETS["registry"]

    def gpu(node: int, ts: int, g: int = 0) -> dict[str, np.ndarray]:
        one = {"node": node, "ts": ts, "gpu": g} | dict.fromkeys(gpu_columns(fs), 1.0)
        return {k: np.array([v]) for k, v in one.items()}

    def xid(node: int, ts: int) -> dict[str, np.ndarray]:
        one = {"node": node, "ts": ts, "gpu": 0, "xid": 48, "count": 1.0}
        return {k: np.array([v]) for k, v in one.items()}

    partial = PartialBuckets(fs, Carry())
    partial.fold(gpu(0, T0, 1), xid(0, T0), None)
    assert not partial.follows(gpu(0, T0, 1), None, None)  # a duplicate: the last one received wins
    assert not partial.follows(gpu(0, T0, 0), None, None)  # same scrape, another GPU: (ts, gpu) order
    assert not partial.follows(gpu(0, T0 - 1), None, None)  # older: counters would difference wrongly
    assert not partial.follows(None, xid(0, T0), None)
    assert partial.follows(gpu(0, T0 + 1), xid(0, T0 + 1), None)
    assert partial.follows(gpu(1, T0 - M), xid(1, T0 - M), None)  # another node: its own order


def _same_as_restored(engine: OnlineFeatureEngine, t: int, tmp: Path) -> None:
    """``engine`` answers at ``t`` bit for bit as a copy restored from its state, which folds
    every pending record at once."""
    got = engine.features_at(t)
    engine.save(tmp / "state.npz")
    once = OnlineFeatureEngine.load(tmp / "state.npz", engine.feature_set).features_at(t)
    assert got["node"].tolist() == once["node"].tolist()
    names = engine.feature_set.names
    np.testing.assert_array_equal(got[names].to_numpy(), once[names].to_numpy(), err_msg=f"t={t}")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    tolerance=st.sampled_from([0, 15_000, 60_000]),
    batch_ms=st.sampled_from([2_000, 7_000, 30_000]),
    which=st.sampled_from(sorted(SETS)),
)
def test_reads_between_small_updates_equal_one_fold_and_the_batch_engine(seed, tolerance, batch_ms, which):
    fs = SETS[which]
    frames, arrival = make_stream(seed, tolerance)
    batch = compute_features(
        gpu=frames["gpu"], xid=frames["xid"], link=frames["link"], events=frames["events"], feature_set=fs
    )
    ticks = batch["ts"].unique()
    engine = OnlineFeatureEngine(fs, tolerance_ms=tolerance, history_ms=10 * M)
    first = min(int(a.min()) for a in arrival.values() if len(a))
    updates = np.unique(np.concatenate([(a - first) // batch_ms for a in arrival.values()]))  # non-empty
    rng = np.random.default_rng(seed)
    reads = set(rng.choice(updates, size=min(len(updates), 12), replace=False)) | {updates[0], updates[-1]}
    opened = None
    with tempfile.TemporaryDirectory() as tmp:
        for u in updates:
            lo = first + int(u) * batch_ms
            feed(engine, frames, arrival, lo, lo + batch_ms, False)
            if tolerance == 0:  # in order: every update is folded in, the statistics never rebuilt
                assert opened is None or engine._open is opened
                opened = engine._open
            if u not in reads:
                continue
            _same_as_restored(engine, (engine.watermark_ms // fs.bucket_ms + 1) * fs.bucket_ms, Path(tmp))
            ready = ticks[ticks <= engine.watermark_ms - tolerance]
            if len(ready):
                t = int(ready[-1])
                assert_same(
                    engine.features_at(t), batch[batch["ts"] == t].reset_index(drop=True), fs.names, f"t={t}"
                )
    assert engine.late_records == 0


def test_a_record_out_of_order_folds_the_open_buckets_again(tmp_path):
    """Node a's counter resets, and one of its samples comes after newer ones (within the
    tolerance): that update cannot be folded in, the next read folds everything again, and the
    rows stay exact."""
    fs = SETS["registry"]
    rows = [  # arrival order
        ("a", T0 + 10_000, 100.0, 50.0),
        ("b", T0 + 10_000, 7.0, 61.0),
        ("a", T0 + 30_000, 104.0, 52.5),
        ("a", T0 + 40_000, 3.0, 53.25),  # reset
        ("a", T0 + 20_000, 101.0, 51.0),  # out of order
        ("b", T0 + 50_000, 9.0, 60.5),
        ("a", T0 + 70_000, 5.0, 54.0),
    ]
    frame = pd.DataFrame(rows, columns=["node", "ts", "ecc_sbe_vol_total", "gpu_temp"]).assign(gpu=0)
    want = compute_features(gpu=frame, feature_set=fs)
    t = int(want["ts"].max())
    engine = OnlineFeatureEngine(fs, tolerance_ms=60_000)
    for i in range(len(frame)):
        engine.update_frame("gpu", frame.iloc[[i]])
        assert (engine._open is None) == (i in (0, 4))  # 0: nothing read yet; 4: out of order
        _same_as_restored(engine, t, tmp_path)
    assert_same(engine.features_at(t), want[want["ts"] == t].reset_index(drop=True), fs.names, f"t={t}")
