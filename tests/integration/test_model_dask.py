"""Distributed training through lightgbm.dask on a real LocalCluster."""

from __future__ import annotations

import json

import pytest

from foreshock.models.train import PRIOR_WEIGHT, train_from_dataset

pytestmark = pytest.mark.integration


def test_lightgbm_dask_on_a_local_cluster(synthetic_cluster, tmp_path):
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, memory_limit="2GiB"
    ) as cluster:
        model = train_from_dataset(
            synthetic_cluster.data_dir,
            tmp_path,
            features=synthetic_cluster.features,
            dask_address=cluster.scheduler_address,
            register=False,
            params={"n_estimators": 80, "learning_rate": 0.1},
        )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["_info"]["distributed"] is True
    assert 10 <= metrics["_info"]["best_iteration"] <= 80
    assert metrics["model"]["pr_auc"] > metrics["rules"]["pr_auc"]
    assert metrics["model"]["pr_auc"] > 5 * metrics["model"]["base_rate"]
    assert model.predict_proba(synthetic_cluster.features.head(10)).shape == (10,)
    # both candidates, trees alone and trees on the linear prior, trained through lightgbm.dask
    val_ap = metrics["_info"]["prior_val_pr_auc"]
    assert set(val_ap) == {"0", f"{PRIOR_WEIGHT:g}"}
    assert f"{model.prior_weight:g}" == max(val_ap, key=val_ap.get)


def test_every_dask_worker_bins_with_the_tail_bounds():
    """Each lightgbm.dask worker builds its own bins from the bounds file written on it: the
    split that isolates the top 0.05 % of a feature is found there too."""
    import numpy as np
    import pandas as pd
    from distributed import LocalCluster

    from foreshock.models.train import DEFAULT_PARAMS, fit_booster

    rng = np.random.default_rng(2)
    x = pd.DataFrame({"spread": rng.normal(size=100_000).astype(np.float32)})  # as train's features are
    y = (x["spread"] > np.quantile(x["spread"], 0.9995)).to_numpy().astype(int)
    params = {**DEFAULT_PARAMS, "num_leaves": 2, "min_child_samples": 10, "n_estimators": 5}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, memory_limit="2GiB"
    ) as cluster:
        booster = fit_booster(x, y, x, y, params, dask_address=cluster.scheduler_address)
    first = float(booster.trees_to_dataframe()["threshold"].dropna().iloc[0])
    assert first >= np.quantile(x["spread"], 0.999)


# lightgbm.dask grows a fixed number of rounds and keeps the best on validation afterwards; the
# single process stops early: their validation PR-AUCs agree within this (absolute)
DASK_VAL_PR_AUC_TOLERANCE = 0.05


def test_dask_workers_train_on_rows_they_read_from_the_feature_table(tmp_path):
    """``train --dask``: the workers read their training rows from the feature table (a day per
    partition), so no feature leaves this process; the model it trains validates as the single
    process's does, within the tolerance."""
    from distributed import Client, LocalCluster, get_task_stream

    from tests.fixtures.model_data import make_synthetic_cluster

    data = make_synthetic_cluster(tmp_path / "data", nodes=16, days=3.0, seed=3).data_dir
    single = tmp_path / "single"
    train_from_dataset(data, single, register=False, folds=2)  # computes the cached table too
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, memory_limit="2GiB"
        ) as cluster,
        Client(cluster) as client,
        get_task_stream(client) as stream,
    ):
        workers = set(client.scheduler_info()["workers"])
        train_from_dataset(data, tmp_path / "dask", dask_address=cluster.scheduler_address, register=False,
                           folds=2)
    reads = [t for t in stream.data if str(t["key"]).find("_table_rows") >= 0]
    assert reads and {t["worker"] for t in reads} <= workers
    on_disk, distributed = (json.loads((d / "metrics.json").read_text()) for d in (single, tmp_path / "dask"))
    assert distributed["_info"]["distributed"] is True and on_disk["_info"]["distributed"] is False
    val = [m["model"]["by_split"]["val"]["pr_auc"] for m in (on_disk, distributed)]
    assert val[0] > 5 * on_disk["model"]["by_split"]["val"]["base_rate"]
    assert abs(val[1] - val[0]) <= DASK_VAL_PR_AUC_TOLERANCE, val
