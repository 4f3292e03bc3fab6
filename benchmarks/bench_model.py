"""Risk-model benchmark: scoring latency for 2,048 nodes in one call, and training time per million rows.

Data: random rows over the default feature set's columns with a planted signal (the cost of
LightGBM does not depend on what the features mean). Each figure is printed beside the same
measurement for the logistic-regression baseline, taken in the same run, and their ratio.

    .venv/bin/python benchmarks/bench_model.py           # ~1 minute
    .venv/bin/python benchmarks/bench_model.py --quick   # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightgbm as lgb
import numpy as np
import pandas as pd

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.models.artifact import RiskModel
from foreshock.models.baselines import LogisticBaseline
from foreshock.models.train import (
    DEFAULT_PARAMS,
    PRIOR_WEIGHT,
    forced_bins_file,
    monotone_directions,
    tail_bin_bounds,
)


def _data(rows: int, names: list[str], seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = pd.DataFrame(rng.normal(size=(rows, len(names))).astype(np.float64), columns=names)
    x.iloc[rng.random(rows) < 0.05, 3] = np.nan
    logit = 1.5 * x.iloc[:, 0] - x.iloc[:, 1].fillna(0) + 0.5 * x.iloc[:, 2] ** 2 - 5.0
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int).to_numpy()
    return x, y


def _timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args()
    names = list(DEFAULT_FEATURE_SET.names)
    train_rows = 50_000 if args.quick else 400_000
    rounds = 30 if args.quick else 200
    repeats = 5 if args.quick else 30

    x, y = _data(train_rows, names)
    t0 = time.perf_counter()
    with forced_bins_file(tail_bin_bounds(x)) as bins:  # trained as train trains: tail bins, monotone trees
        params = {
            **DEFAULT_PARAMS,
            "forcedbins_filename": bins,
            "monotone_constraints": monotone_directions(names),
            "scale_pos_weight": 5.0,
        }
        booster = lgb.train(params, lgb.Dataset(x, y), num_boost_round=rounds)
    lgb_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    logistic = LogisticBaseline(names, max_rows=train_rows).fit(x, y)
    lr_s = time.perf_counter() - t0
    per_m = 1e6 / train_rows
    print(f"training: {train_rows:,} rows x {len(names)} features, {rounds} rounds, 1 thread")
    print(f"  LightGBM   {lgb_s * per_m:8.1f} s per million rows")
    print(f"  logistic   {lr_s * per_m:8.1f} s per million rows (baseline)")
    print(f"  ratio LightGBM / logistic: {lgb_s / lr_s:.2f}")

    model = RiskModel(
        booster,
        feature_names=names,
        feature_set_hash=DEFAULT_FEATURE_SET.hash,
        threshold=0.5,
        prior=logistic,
        prior_weight=PRIOR_WEIGHT,  # scored as trained models are: trees plus the linear prior
    )
    batch, _ = _data(2048, names, seed=1)
    batch.insert(0, "node", [f"node{i:04d}" for i in range(2048)])
    score_s = _timed(lambda: model.predict_proba(batch), repeats)
    explain_s = _timed(lambda: model.top_features(batch, k=5), max(2, repeats // 5))
    lr_score_s = _timed(lambda: logistic.score(batch), repeats)
    print(f"scoring 2,048 nodes in one call (median of {repeats}):")
    print(f"  predict_proba          {score_s * 1e3:8.2f} ms (trees and the linear prior)")
    print(f"  top_features (SHAP)    {explain_s * 1e3:8.2f} ms")
    print(f"  logistic score         {lr_score_s * 1e3:8.2f} ms (baseline)")
    print(f"  ratio predict_proba / logistic: {score_s / lr_score_s:.1f}")


if __name__ == "__main__":
    main()
