"""Time-blocked folds for the budget threshold: what each fold model trains on, what it scores,
and how the folds pool."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.models.alerting import EvalRows
from foreshock.models.folds import (
    Fold,
    choose_thresholds,
    fold_outside,
    out_of_fold,
    time_folds,
    training_blocks,
)

MIN = 60_000
H = 60 * MIN


def _rows(nodes: int, start_min: int, minutes: int) -> pd.DataFrame:
    """Unlabelled rows of ``nodes`` nodes, one a minute from ``start_min``."""
    ts = (start_min + np.arange(minutes)) * MIN
    return pd.DataFrame({
        "node": np.repeat([f"n{i}" for i in range(nodes)], minutes),
        "ts": np.tile(ts, nodes),
        "label": np.zeros(nodes * minutes, dtype=np.int8),
        "failure_ts": pd.array([pd.NA] * (nodes * minutes), dtype="Int64"),
        "cause": None,
        "detectable": None,
    })


TRAIN = _rows(3, 0, 3000)  # minutes 0..2999
VAL = _rows(3, 3060, 1000)  # a purge gap of H, then minutes 3060..4059


def test_time_folds_cut_the_training_period_and_end_with_validation():
    folds = time_folds(TRAIN, VAL, 4)
    assert [f.index for f in folds] == [0, 1, 2, 3]
    assert [f.scored_by for f in folds] == ["fold model"] * 3 + ["model"]
    assert folds[0].start_ms == 0 and folds[2].end_ms == 3000 * MIN - MIN + 1
    assert all(a.end_ms == b.start_ms for a, b in zip(folds[:2], folds[1:3], strict=True))
    assert (folds[3].start_ms, folds[3].end_ms) == (3060 * MIN, 4059 * MIN + 1)
    assert [f.scored_by for f in time_folds(TRAIN, VAL, 1)] == ["model"]
    with pytest.raises(ValueError, match="folds"):
        time_folds(TRAIN, VAL, 0)


def test_a_fold_model_never_trains_on_its_block_or_the_horizon_either_side():
    history = pd.concat([TRAIN, VAL])
    fold = time_folds(TRAIN, VAL, 4)[1]
    kept = history["ts"][fold_outside(history, fold, H)]
    assert ((kept < fold.start_ms - H) | (kept >= fold.end_ms + H)).all()
    gap = history["ts"][(history["ts"] >= fold.start_ms - H) & (history["ts"] < fold.end_ms + H)]
    assert len(kept) + len(gap) == len(history) and len(gap) > 0


def test_out_of_fold_scores_each_block_once_with_its_own_model_and_keeps_blocks_apart():
    seen: list[tuple[Fold, pd.DataFrame]] = []
    happened: list[tuple[str, int]] = []
    folds, block_of = _blocks(TRAIN, VAL, 4)

    def fit_fold(fold: Fold):
        happened.append(("fitted", fold.index))

        def score(block: pd.DataFrame) -> dict[str, np.ndarray]:
            seen.append((fold, block))
            ts = block["ts"].to_numpy(dtype=float)
            return {"model": ts, "rules": -ts}  # a score that names its row

        return score

    def read_block(fold: Fold) -> pd.DataFrame:
        happened.append(("read", fold.index))
        return block_of(fold)

    val_scores = {"model": VAL["ts"].to_numpy(dtype=float), "rules": -VAL["ts"].to_numpy(dtype=float)}
    scored = list(out_of_fold(folds, read_block, VAL, lambda: val_scores, fit_fold, cadence_ms=MIN,
                              clear_ms=30 * MIN))
    assert len(seen) == 3 and [s.fold.scored_by for s in scored][-1] == "model"
    # each block is read only once its fold models are fitted: the two never share memory
    assert happened == [(step, f.index) for f in folds[:3] for step in ("fitted", "read")]
    for (fold, block), s in zip(seen, scored, strict=False):
        assert fold == s.fold
        assert block["ts"].between(fold.start_ms, fold.end_ms - 1).all()  # the block is the fold's rows
        assert len(block) == len(s.rows.frame)
        in_order = block.sort_values(["node", "ts"], kind="stable")["ts"].to_numpy(dtype=float)
        assert np.array_equal(s.scores["model"], in_order)  # scores follow the rows' (node, ts) order
    assert sum(len(s.rows.frame) for s in scored) == len(TRAIN) + len(VAL)  # every row scored once
    assert np.array_equal(scored[-1].scores["model"], val_scores["model"])
    assert all(s.rows.frame.columns.empty for s in scored)  # the folds hold what the threshold counts


def test_a_training_period_in_time_order_gives_each_fold_the_same_rows_sliced():
    folds = time_folds(TRAIN, VAL, 4)
    in_time = TRAIN.sort_values("ts", kind="stable")
    by_node, by_time = list(training_blocks(TRAIN, folds)), list(training_blocks(in_time, folds))
    assert [f for f, _ in by_node] == [f for f, _ in by_time] == folds[:3]  # the fold models' blocks
    for (_, node_order), (_, time_order) in zip(by_node, by_time, strict=True):
        assert np.shares_memory(time_order["ts"].to_numpy(), in_time["ts"].to_numpy())  # a slice
        pd.testing.assert_frame_equal(time_order.sort_index(), node_order.sort_index())


def _blocks(train: pd.DataFrame, val: pd.DataFrame, n: int):
    """out_of_fold's folds and block_of for ``train``'s blocks held in memory."""
    folds = time_folds(train, val, n)
    return folds, dict(training_blocks(train, folds)).__getitem__


def test_pooled_folds_keep_an_episode_from_spanning_two_blocks():
    """A node alerting on both sides of a block boundary raises two false alarms: the blocks are
    scored by different models, and the pool never joins their rows."""
    def fit_fold(fold):
        return lambda block: {"model": np.ones(len(block))}  # every row of every fold alerts

    scored = list(out_of_fold(*_blocks(TRAIN, VAL, 4), VAL, lambda: {"model": np.ones(len(VAL))}, fit_fold,
                              cadence_ms=MIN, clear_ms=30 * MIN))
    choice = choose_thresholds(scored, budget_per_1000_node_days=1e6, confidence=0.9)["model"]
    assert choice.false_alarms == 4 * 3  # one episode per node and fold
    assert choice.node_days == pytest.approx((len(TRAIN) + len(VAL)) / 1440)
    single = EvalRows(pd.concat([TRAIN, VAL]), MIN, 30 * MIN)
    assert single.episodes(np.ones(len(single.frame), dtype=bool))[1] == 2 * 3  # joined: only the val gap
