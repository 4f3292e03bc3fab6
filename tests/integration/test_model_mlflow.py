"""The MLflow path against a real ``mlflow server``: logging, registration, the champion duel,
and ``foreshock train`` / ``foreshock evaluate`` through ``models:/`` URIs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.models.artifact import RiskModel
from foreshock.models.registry import CHAMPION_ALIAS, MODEL_NAME, champion_version, load_champion
from foreshock.models.train import train_from_dataset

pytestmark = pytest.mark.integration


def test_champion_moves_only_when_the_new_model_wins(synthetic_cluster, mlflow_server, tmp_path):
    features = synthetic_cluster.features
    rng = np.random.default_rng(3)
    # A weaker model on another feature set (its signal columns scrambled and renamed).
    weak = features.assign(**{c: rng.permutation(features[c].to_numpy()) for c in ("sbe_10m", "temp_drift")})
    weak = weak.rename(columns={"sbe_10m": "scrambled_sbe", "temp_drift": "scrambled_temp"})
    weak.attrs["feature_set_hash"] = "scrambled-" + features.attrs["feature_set_hash"]  # its own identity
    assert champion_version(mlflow_server) is None

    first = train_from_dataset(
        synthetic_cluster.data_dir, tmp_path / "weak", tracking_uri=mlflow_server, features=weak
    )
    assert (
        first.version == "1" and champion_version(mlflow_server) == "1"
    )  # no champion yet: it takes the alias

    # Another feature set: the champion cannot score these rows, its recorded test PR-AUC stands in.
    good = train_from_dataset(
        synthetic_cluster.data_dir, tmp_path / "good", tracking_uri=mlflow_server, features=features
    )
    assert good.version == "2" and champion_version(mlflow_server) == "2"
    info = json.loads((tmp_path / "good" / "metrics.json").read_text())["_info"]["registry"]
    assert info == {"version": "2", "promoted": True, "previous_champion": "1"}

    # Same feature set, same rows, same (deterministic) model: a tie does not move the alias.
    again = train_from_dataset(
        synthetic_cluster.data_dir, tmp_path / "again", tracking_uri=mlflow_server, features=features
    )
    assert again.version == "3" and champion_version(mlflow_server) == "2"

    champion = load_champion(mlflow_server)
    assert champion.version == "2" and champion.feature_set_hash == good.feature_set_hash
    assert np.allclose(champion.predict_proba(features.head(200)), good.predict_proba(features.head(200)))
    assert champion.baselines["logistic"]["coef"] == good.baselines["logistic"]["coef"]
    assert champion.prior_weight == good.prior_weight  # the linear prior's weight travels in the metadata

    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    mv = client.get_model_version_by_alias(MODEL_NAME, CHAMPION_ALIAS)
    run = client.get_run(mv.run_id)
    assert run.data.params["feature_set_hash"] == good.feature_set_hash
    assert len(run.data.params["dataset_fingerprint"]) == 16
    assert run.data.metrics["model.test.pr_auc"] > run.data.metrics["rules.test.pr_auc"]
    equal_rate = json.loads((tmp_path / "good" / "metrics.json").read_text())["model"]["by_split"]["val"]
    assert run.data.metrics["model.val.recall_at_false_alarm_rate_5"] == \
        equal_rate["recall_at_false_alarm_rates"]["5"]["recall"]
    logged = {a.path for a in client.list_artifacts(mv.run_id)}
    assert {"metrics.json", "report.md", "pr_curves.png", "importance_shap.png"} <= logged
    local = RiskModel.load(f"models:/{MODEL_NAME}/1", tracking_uri=mlflow_server)
    assert local.version == "1"


def test_cli_train_and_evaluate_a_registered_model(mlflow_server, tmp_path):
    """The real pipeline: simulator -> feature engine -> train (registered) -> evaluate another seed."""
    runner = CliRunner()
    for seed, name in ((3, "train-data"), (4, "eval-data")):
        result = runner.invoke(
            app,
            [
                "simulate",
                "--profile",
                "llama3",
                "--nodes",
                "16",
                "--days",
                "1.5",
                "--interval",
                "60s",
                "--seed",
                str(seed),
                "--rate-multiplier",
                "600",
                "--out",
                str(tmp_path / name),
            ],
        )
        assert result.exit_code == 0, result.output
    result = runner.invoke(
        app,
        [
            "train",
            "--data",
            str(tmp_path / "train-data"),
            "--tracking-uri",
            mlflow_server,
            "--censor",
            "3h",
            "--alert-clear",
            "20m",
            "--prior-weight",
            "0.2",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "model vs baselines" in result.output and "logistic" in result.output
    assert "failures caught at equal false-alarm rates" in result.output
    info = json.loads((tmp_path / "run" / "metrics.json").read_text())["_info"]
    version = info["registry"]["version"]
    assert info["censor_ms"] == 3 * 3_600_000 and info["cadence_ms"] == 60_000
    assert info["alert_clear_ms"] == 20 * 60_000 and set(info["prior_val_pr_auc"]) == {"0", "0.2"}
    assert f"version {version}" in result.output
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--model",
            f"models:/{MODEL_NAME}/{version}",
            "--data",
            str(tmp_path / "eval-data"),
            "--data",
            str(tmp_path / "train-data"),
            "--tracking-uri",
            mlflow_server,
            "--cadence",
            "5m",
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["_info"]["model_version"] == version
    assert metrics["_info"]["cadence_ms"] == 300_000  # --cadence overrides the training cadence
    assert metrics["_info"]["alert_clear_ms"] == 20 * 60_000  # episodes end as they did in training
    assert all(0 <= metrics[p]["pr_auc"] <= 1 for p in ("model", "rules", "logistic"))
    assert (tmp_path / "eval" / "report.md").exists()
    # two --data: judged as one pool, each dataset's figures kept beside it
    parts = metrics["model"]["by_dataset"]
    assert set(parts) == {"eval-data", "train-data"}
    assert metrics["model"]["failures"] == sum(part["failures"] for part in parts.values())
    assert [d["seed"] for d in metrics["_info"]["datasets"]] == [4, 3]
