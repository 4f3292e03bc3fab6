"""Labels and splits: what counts as positive, which rows are left out, and time order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.models.labels import NO_RECENT_RETURN_MS, label_rows
from foreshock.models.splits import make_split
from foreshock.models.train import censor_before_failures

MIN = 60_000
H = 60 * MIN


def _rows(node: str, minutes: range) -> pd.DataFrame:
    return pd.DataFrame({"node": node, "ts": [m * MIN for m in minutes], "x": 0.0})


def _events(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["node", "ts", "event", "cause", "detectable"])


def test_positive_exactly_when_failure_in_open_closed_horizon():
    rows = _rows("n0", range(0, 400))
    events = _events(("n0", 200 * MIN, "failed", "gpu", True), ("n0", 300 * MIN, "repaired", None, None))
    out = label_rows(rows, events, H).set_index("ts")
    assert out.loc[140 * MIN, "label"] == 1  # failure exactly at t + H is inside (t, t+H]
    assert out.loc[139 * MIN, "label"] == 0
    assert out.loc[199 * MIN, "label"] == 1
    assert out.loc[199 * MIN, "cause"] == "gpu" and out.loc[199 * MIN, "detectable"] is True
    assert out.loc[139 * MIN, "cause"] is None or pd.isna(out.loc[139 * MIN, "cause"])
    # the failure instant and the down period are left out; the repair instant is back in
    assert 200 * MIN not in out.index and 299 * MIN not in out.index
    assert out.loc[300 * MIN, "label"] == 0
    assert (out["label"] == 1).sum() == 60
    # when the node last came back: for the evaluation's count of alarms right after a repair
    assert out.loc[199 * MIN, "since_return_ms"] == NO_RECENT_RETURN_MS
    assert out.loc[300 * MIN, "since_return_ms"] == 0 and out.loc[339 * MIN, "since_return_ms"] == 39 * MIN
    assert out["since_return_ms"].dtype == np.int32


def test_rows_without_a_failure_ahead_share_one_missing_cause():
    """A fleet's month is tens of millions of rows, nearly all negative: a missing cause or
    detectable must not be a Python object per row."""
    rows = _rows("n0", range(0, 400))
    events = _events(("n0", 200 * MIN, "failed", "gpu", True), ("n0", 300 * MIN, "repaired", None, None))
    out = label_rows(rows, events, H)
    negative = out["label"].to_numpy() == 0
    for column in ("cause", "detectable"):
        missing = out[column].to_numpy()[negative]
        assert pd.isna(missing).all() and len({id(x) for x in missing}) == 1


def test_down_and_drained_rows_left_out_and_other_nodes_untouched():
    rows = pd.concat([_rows("n0", range(0, 200)), _rows("n1", range(0, 200))])
    events = _events(
        ("n0", 10 * MIN, "drained", None, None),
        ("n0", 20 * MIN, "up", None, None),
        ("n1", 50 * MIN, "down", None, None),
    )
    out = label_rows(rows, events, H, end_ms=400 * MIN)
    n0 = set(out.loc[out["node"] == "n0", "ts"] // MIN)
    n1 = set(out.loc[out["node"] == "n1", "ts"] // MIN)
    assert n0 == set(range(200)) - set(range(10, 20))
    assert n1 == set(range(50))
    assert out["label"].sum() == 0


def test_last_horizon_is_censored():
    rows = _rows("n0", range(0, 200))
    out = label_rows(rows, _events(), H, end_ms=199 * MIN)
    assert out["ts"].max() == 139 * MIN


def test_failure_xid_at_the_failure_instant_is_invisible_to_labelled_rows(tmp_path):
    """Rule evidence (raw telemetry at or before t) never shows the failure's own fatal Xid."""
    import json

    from foreshock.models.baselines import rule_inputs

    (tmp_path / "xid").mkdir()
    (tmp_path / "gpu").mkdir()
    pd.DataFrame({"node": ["n0"], "ts": [200 * MIN], "gpu": [0], "xid": [79], "count": [1]}).to_parquet(
        tmp_path / "xid" / "part-00000.parquet"
    )
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    events = _events(("n0", 200 * MIN, "failed", "gpu", True), ("n0", 300 * MIN, "repaired", None, None))
    out = label_rows(_rows("n0", range(0, 400)), events, H)
    evidence = rule_inputs(tmp_path, out, MIN)
    assert evidence.loc[out["label"] == 1, "rule_critical"].eq(0).all()
    # while a row at the failure instant would have seen it
    at_failure = rule_inputs(tmp_path, _rows("n0", range(200, 201)), MIN)
    assert at_failure["rule_critical"].iloc[0] == 1


def test_rows_that_already_carry_labels_are_refused():
    with pytest.raises(ValueError):
        label_rows(_rows("n0", range(3)).assign(label=1), _events(), H)


def test_split_is_time_ordered_purged_and_holds_out_nodes():
    nodes = [f"node{i:04d}" for i in range(40)]
    rows = pd.concat([_rows(n, range(0, 1000)) for n in nodes], ignore_index=True)
    split = make_split(rows, H, holdout_fraction=0.2)
    masks = split.masks(rows)
    ts = rows["ts"].to_numpy()
    assert ts[masks["train"]].max() < split.val_start_ms - H + 1
    assert ts[masks["val"]].min() >= split.val_start_ms
    assert ts[masks["val"]].max() < split.test_start_ms - H + 1
    assert ts[masks["test"]].min() >= split.test_start_ms
    assert not (masks["train"] & masks["val"]).any() and not (masks["val"] & masks["test"]).any()
    held = rows.loc[masks["test_unseen_nodes"], "node"].unique()
    assert 0 < len(held) < len(nodes)
    assert not rows.loc[masks["train"] | masks["val"], "node"].isin(held).any()
    assert set(held) == set(split.holdout_nodes)
    # the held-out set depends on node ids only
    again = make_split(rows.sample(frac=1.0, random_state=1), H, holdout_fraction=0.2)
    assert again.holdout_nodes == split.holdout_nodes
    assert np.all(np.diff(np.sort(ts[masks["train"]])) >= 0)


def test_training_censors_only_the_negatives_shortly_before_a_failure():
    rows = pd.concat([_rows("n0", range(0, 600)), _rows("n1", range(0, 600))])
    events = _events(("n0", 500 * MIN, "failed", "ecc", True))
    labelled = label_rows(rows, events, H, end_ms=700 * MIN)
    kept = censor_before_failures(labelled, 3 * H)
    gone = labelled.merge(kept, how="left", indicator=True).query("_merge == 'left_only'")
    # negatives in [f - 3H, f - H) of n0 go; its positives, its earlier rows and all of n1 stay
    assert set(gone["node"]) == {"n0"} and (gone["label"] == 0).all()
    assert sorted(gone["ts"]) == [m * MIN for m in range(320, 440)]
    assert (kept["label"] == 1).sum() == (labelled["label"] == 1).sum() == 60
    assert censor_before_failures(labelled, 0) is labelled


@pytest.mark.parametrize("last, kept", [("up", True), ("down", False)])
def test_of_several_events_at_one_instant_the_last_in_table_order_wins(last, kept):
    first = "down" if last == "up" else "up"
    events = _events(("n0", 50 * MIN, first, None, None), ("n0", 50 * MIN, last, None, None))
    out = label_rows(_rows("n0", range(0, 200)), events, H, end_ms=400 * MIN)
    assert (50 * MIN in set(out["ts"])) is kept and (120 * MIN in set(out["ts"])) is kept
    assert 49 * MIN in set(out["ts"])  # before the instant the node was in service either way


def test_a_row_takes_the_next_failure_of_its_own_node_strictly_after_it():
    events = _events(("n1", 30 * MIN, "failed", "link", False), ("n0", 40 * MIN, "failed", "gpu", True),
                     ("n0", 40 * MIN, "failed", "ecc", True))
    rows = pd.concat([_rows("n0", range(0, 41)), _rows("n1", range(0, 31))], ignore_index=True)
    out = label_rows(rows, events, H, end_ms=400 * MIN).set_index(["node", "ts"])
    assert out.loc[("n0", 39 * MIN), "cause"] == "gpu"  # of two at one instant, the first in table order
    assert out.loc[("n0", 29 * MIN), "failure_ts"] == 40 * MIN  # n1's failure at 30 min is not n0's
    assert out.loc[("n1", 29 * MIN), "cause"] == "link" and out.loc[("n1", 29 * MIN), "label"] == 1
    assert ("n0", 40 * MIN) not in out.index  # the failure instant itself is down
