"""The batch engine against a naive reference that applies each aggregation's definition to
the raw records of the window, with no buckets, prefix sums or kernels: the semantics, not
just the agreement of two engines. Enumerates every feature of the registry-wide set."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from foreshock.features.batch import compute_features
from foreshock.features.spec import NODE_EVENT_FIELDS, Feature, FeatureSet
from tests.unit.test_features_parity import REGISTRY_SET, make_stream

B = 60_000


def _dedup(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.drop_duplicates(keys, keep="last").sort_values(["ts", *keys[2:]], kind="stable")


def _increases(df: pd.DataFrame, member: str, field: str) -> pd.DataFrame:
    """Reset-aware increase of ``field`` at each present sample, per (node, member)."""
    rows = df[df[field].notna()].sort_values("ts", kind="stable")
    prev = rows.groupby(["node", member])[field].shift()
    d = np.where(prev.isna(), 0.0, np.where(rows[field] >= prev, rows[field] - prev, rows[field]))
    return rows.assign(_inc=d)


def _peak_distinct(rows: pd.DataFrame, member: str, mask: pd.Series) -> float:
    hit = rows[mask]
    if hit.empty:
        return 0.0
    return float(hit.assign(_b=hit["ts"] // B).groupby("_b")[member].nunique().max())


def reference(f: Feature, t: int, node: str, frames: dict[str, pd.DataFrame], fs: FeatureSet) -> float:
    lo = t - f.window_ms
    if f.source == "node":  # the node's own events of the field, each (ts) once
        e = frames["events"]
        e = e[(e["node"] == node) & e["event"].isin(NODE_EVENT_FIELDS[f.field])]
        e = e[(e["ts"] >= lo) & (e["ts"] < t)]
        if f.agg == "count":
            return float(e["ts"].nunique())
        return (t - e["ts"].max()) / 1000 if len(e) else np.nan
    if f.source == "xid":
        x = frames["xid"]
        classes = {c: k for k, cs in fs.xid_classes.items() for c in cs}
        x = x[(x["node"] == node) & (x["ts"] >= lo) & (x["ts"] < t)]
        x = x[x["xid"].map(lambda c: classes.get(c, "other")) == f.field]
        if f.agg == "count":
            return float(x["count"].sum())
        return (t - x["ts"].max()) / 1000 if len(x) else np.nan
    table, member = ("gpu", "gpu") if f.source == "gpu" else ("link", "port")
    data = frames[table][frames[table]["node"] == node]
    if f.agg in ("increase", "gpus_increasing"):
        inc = _increases(data, member, f.field)
        inc = inc[(inc["ts"] >= lo) & (inc["ts"] < t)]
        if f.agg == "increase":
            return float(inc["_inc"].sum())
        per = inc.assign(_b=inc["ts"] // B).groupby(["_b", member])["_inc"].sum()
        per = per[per > f.threshold]
        return float(per.groupby(level=0).size().max()) if len(per) else 0.0
    rows = data[(data["ts"] >= lo) & (data["ts"] < t)]
    if f.agg == "ports_down":
        state = rows["state"].astype("string").str.upper()
        return _peak_distinct(rows, member, state.notna() & ~state.str.contains("ACTIVE").fillna(True))
    v = rows[f.field]
    if f.agg == "gpus_above":
        return _peak_distinct(rows, member, v > f.threshold)
    v, ts = v[v.notna()], rows["ts"][v.notna()]
    if not len(v):
        return np.nan
    if f.agg == "last":
        return float(rows.loc[v.index].sort_values(["ts", "gpu"])[f.field].iloc[-1])
    if f.agg == "slope":
        k = (ts // B - t // B).to_numpy(float)
        if len(np.unique(k)) < 2:
            return np.nan
        return float(np.polyfit(k, v.to_numpy(float), 1)[0] * 3_600_000 / B)
    stats = {
        "mean": v.mean,
        "max": v.max,
        "min": v.min,
        "std": lambda: v.std(ddof=0),
        "spread": lambda: v.max() - v.mean(),
    }
    return float(stats[f.agg]())


@pytest.mark.parametrize("seed", [3, 11, 2024])
def test_batch_engine_matches_the_definitions(seed):
    frames, _ = make_stream(seed, 0)
    fs = dataclasses.replace(REGISTRY_SET, reset_on_return=False)  # the definitions read whole windows
    table = compute_features(
        gpu=frames["gpu"], xid=frames["xid"], link=frames["link"], events=frames["events"], feature_set=fs
    )
    clean = {
        "gpu": _dedup(frames["gpu"], ["node", "ts", "gpu"]),
        "xid": _dedup(frames["xid"], ["node", "ts", "gpu", "xid"]),
        "link": _dedup(frames["link"], ["node", "ts", "port"]),
        "events": frames["events"],
    }
    rng = np.random.default_rng(seed)
    rows = table.iloc[rng.choice(len(table), size=min(5, len(table)), replace=False)]
    for _, row in rows.iterrows():
        for f in fs.features:
            want = reference(f, int(row["ts"]), row["node"], clean, fs)
            got = row[f.name]
            assert np.isclose(got, want, rtol=1e-9, atol=1e-9, equal_nan=True), (f.name, row["ts"], got, want)


def test_rows_exist_exactly_where_a_node_reported_within_live_ms():
    frames, _ = make_stream(5, 0)
    fs = REGISTRY_SET
    table = compute_features(gpu=frames["gpu"], xid=frames["xid"], link=frames["link"], feature_set=fs)
    ts = pd.concat([f[["node", "ts"]] for f in frames.values()])
    for t in table["ts"].unique()[::3]:
        recent = ts[(ts["ts"] >= t - fs.live_ms) & (ts["ts"] < t)]
        assert sorted(table.loc[table["ts"] == t, "node"]) == sorted(recent["node"].unique())


def test_cadence_and_time_range_select_ticks_without_changing_values():
    frames, _ = make_stream(8, 0)
    fs = REGISTRY_SET
    every = compute_features(gpu=frames["gpu"], xid=frames["xid"], link=frames["link"], feature_set=fs)
    ticks = every["ts"].unique()
    lo, hi = int(ticks[len(ticks) // 3]), int(ticks[2 * len(ticks) // 3])
    coarse = compute_features(
        gpu=frames["gpu"],
        xid=frames["xid"],
        link=frames["link"],
        feature_set=fs,
        cadence_ms=5 * B,
        start_ms=lo,
        end_ms=hi,
    )
    assert len(coarse) and (coarse["ts"] % (5 * B) == 0).all() and coarse["ts"].between(lo, hi).all()
    want = every[every["ts"].isin(set(coarse["ts"]))].reset_index(drop=True)
    pd.testing.assert_frame_equal(coarse, want)  # peers compare within one tick: unchanged too
    with pytest.raises(ValueError, match="multiple"):
        compute_features(gpu=frames["gpu"], feature_set=fs, cadence_ms=90_000)
