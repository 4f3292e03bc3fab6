"""``foreshock calibrate`` against a real ``mlflow server``: a trained champion's threshold is set on
a new cluster's telemetry and registered as a new version; when the alias moves, the risk
service (in process, on the in-memory bus, loading from the registry) serves the new threshold."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.simulator import DEFAULT_START_MS, stream, write_dataset
from foreshock.models.artifact import RiskModel
from foreshock.models.registry import (
    CHAMPION_ALIAS,
    CHAMPION_URI,
    MODEL_NAME,
    champion_version,
    log_and_register,
)
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import RegistryModelSource
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def scores_of_segment(service: RiskService, bus: InMemoryBus, hour: int) -> list:
    """Publish an hour of telemetry starting ``hour`` hours into the day and score all of it."""
    stream(simulator(minutes=60, seed=5, start_ms=DEFAULT_START_MS + hour * HOUR_MS), bus)
    got, quiet = [], 0
    while quiet < 2:
        batch = service.run_once()
        got += batch
        quiet = 0 if batch or service.lag_records else quiet + 1
    assert got, "the service scored nothing"
    return got


def calibrate(*args: str):
    result = CliRunner().invoke(app, ["calibrate", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_calibrate_registers_a_version_and_the_service_serves_it_once_the_alias_moves(
    mlflow_server, risk_model_dir, tmp_path
):
    trained = log_and_register(RiskModel.load(risk_model_dir), tracking_uri=mlflow_server, params={},
                               metrics={}, dataset_fingerprint="calibrate-tests", score_on_test=lambda m: 0.5)
    assert trained.promoted
    cluster = write_dataset(simulator(12 * 60, seed=9), tmp_path / "new-cluster")
    bus = InMemoryBus(partitions=1)
    source = RegistryModelSource(CHAMPION_URI, mlflow_server)  # follows the alias, as `foreshock serve` does
    service = RiskService(bus, OnlineEngines(DEFAULT_FEATURE_SET), source,
                          config=ServiceConfig(score_every_ms=300_000, reload_every_ms=0)).start()
    old = service.model.threshold
    assert {s.threshold for s in scores_of_segment(service, bus, 0)} == {old}

    output = calibrate("--model", CHAMPION_URI, "--data", str(cluster), "--budget", "1000", "--tracking-uri",
                       mlflow_server, "--out", str(tmp_path / "calibrated"))
    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    version = str(int(trained.version) + 1)
    assert f"version {version} (calibrated from version {trained.version})" in output
    calibrated = RiskModel.load(f"models:/{MODEL_NAME}/{version}", tracking_uri=mlflow_server)
    saved = RiskModel.load(tmp_path / "calibrated" / "model")
    assert calibrated.threshold == saved.threshold != old
    assert calibrated.booster.model_to_string() == RiskModel.load(risk_model_dir).booster.model_to_string()
    record = calibrated.threshold_source
    assert record["kind"] == "calibrate" and record["budget_false_alarms_per_1000_node_days"] == 1000
    assert record["from_version"] == trained.version and record["dataset"] == str(cluster.resolve())
    tags = client.get_model_version(MODEL_NAME, version).tags
    assert tags["threshold_source"] == "calibrate"
    assert float(tags["threshold"]) == pytest.approx(calibrated.threshold)
    assert tags["threshold_dataset_fingerprint"] == record["dataset_fingerprint"]
    assert tags["threshold_budget_false_alarms_per_1000_node_days"] == "1000.0"
    assert client.get_model_version(MODEL_NAME, trained.version).tags["threshold_source"] == "train"

    # registered but not yet promoted: the service keeps serving the champion
    assert champion_version(mlflow_server) == trained.version
    assert {s.threshold for s in scores_of_segment(service, bus, 1)} == {old}

    client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, version)
    assert service.run_once() == [] and service.model.version == version  # the next cycle reloads
    moved = scores_of_segment(service, bus, 2)
    assert {(s.threshold, s.model_version) for s in moved} == {(calibrated.threshold, version)}
    assert service.model.threshold_source == record

    # --alias moves it in the same step; labels ignored: every alert counted, never a lower threshold
    output = calibrate("--model", f"models:/{MODEL_NAME}/{trained.version}", "--data", str(cluster),
                       "--budget", "1000", "--unlabelled", "--alias", CHAMPION_ALIAS,
                       "--tracking-uri", mlflow_server)
    assert "unlabelled: every alert episode counted as a false alarm" in output
    latest = str(int(version) + 1)
    assert champion_version(mlflow_server) == latest
    strict = RiskModel.load(CHAMPION_URI, tracking_uri=mlflow_server)
    assert not strict.threshold_source["labelled"] and strict.threshold >= calibrated.threshold
    service.run_once()
    assert {s.model_version for s in scores_of_segment(service, bus, 3)} == {latest}


def test_calibrate_refuses_bad_input_with_a_clear_error(tmp_path, risk_model_dir):
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--model", str(risk_model_dir), "--data", str(tmp_path),
                                 "--budget", "1", "--no-register"])
    assert result.exit_code == 2 and "not a dataset" in result.output
    result = runner.invoke(app, ["calibrate", "--model", str(risk_model_dir), "--data", str(tmp_path),
                                 "--budget", "1", "--no-register", "--alias", "champion"])
    assert result.exit_code == 2 and "--alias" in result.output
