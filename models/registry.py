"""MLflow tracking and registry I/O for the risk model.

Every training run logs its parameters, the dataset fingerprint, the feature-set hash, metrics,
plots and the model (LightGBM text through MLflow's lightgbm flavour, with :class:`RiskModel`'s
JSON as the flavour's ``metadata``). The model is registered as ``foreshock-risk``; the alias
``champion`` moves to the new version only when it beats the current champion on the *new* run's
test split (both scored on the same rows), so a model trained on easier data cannot win on a
number measured elsewhere. The predictor polls :func:`champion_version` to reload when it moves.
``foreshock calibrate`` registers the same booster again with a threshold set on another
cluster's telemetry (:func:`register_calibrated`); every version is tagged with its threshold and
where it came from (``threshold``, ``threshold_source`` and ``threshold_*``).

The tracking URI is always passed in. For a ``sqlite:///…/mlflow.db`` store, artifacts go to an
``mlartifacts`` folder beside the database file (never to the process's working directory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from foreshock.models.artifact import RiskModel

__all__ = [
    "MODEL_NAME",
    "CHAMPION_ALIAS",
    "EXPERIMENT",
    "Registration",
    "log_and_register",
    "register_calibrated",
    "load_champion",
    "champion_version",
    "download_registered",
    "sqlite_uri",
]

MODEL_NAME = "foreshock-risk"
CHAMPION_ALIAS = "champion"
EXPERIMENT = "foreshock-risk"
CHAMPION_URI = f"models:/{MODEL_NAME}@{CHAMPION_ALIAS}"


def sqlite_uri(data_dir: str | Path) -> str:
    """The embedded default tracking store for a data folder: ``sqlite:///<dir>/mlflow.db``."""
    return f"sqlite:///{Path(data_dir).resolve() / 'mlflow.db'}"


def _client(tracking_uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _experiment_id(client: MlflowClient, tracking_uri: str) -> str:
    found = client.get_experiment_by_name(EXPERIMENT)
    if found is not None:
        return found.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    try:
        return client.create_experiment(EXPERIMENT, artifact_location=location)
    except MlflowException:  # created concurrently
        return client.get_experiment_by_name(EXPERIMENT).experiment_id


def champion_version(tracking_uri: str) -> str | None:
    """The registry version number (as text) that holds the ``champion`` alias, or None."""
    try:
        return str(_client(tracking_uri).get_model_version_by_alias(MODEL_NAME, CHAMPION_ALIAS).version)
    except MlflowException:
        return None


def download_registered(uri: str, tracking_uri: str | None, dest: Path) -> tuple[Path, str]:
    """Download a ``models:/name@alias`` or ``models:/name/N`` model into ``dest``; returns
    (folder, version). The caller owns ``dest``: a service that reloads on every alias move
    must not leave a copy behind each time."""
    if tracking_uri is None:
        raise ValueError("a models:/ URI needs a tracking URI")
    client = _client(tracking_uri)
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        mv = client.get_model_version_by_alias(name, alias)
    else:
        name, number = ref.rsplit("/", 1)
        mv = client.get_model_version(name, number)
    # Resolve through this client: a bare models:/ URI would consult the process-wide registry.
    source = client.get_model_version_download_uri(mv.name, mv.version)
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=source, dst_path=str(dest), tracking_uri=tracking_uri
    )
    return Path(local), str(mv.version)


def load_champion(tracking_uri: str) -> RiskModel:
    """The model that holds the ``champion`` alias (raises if there is none)."""
    return RiskModel.load(CHAMPION_URI, tracking_uri=tracking_uri)


@dataclass(frozen=True)
class Registration:
    """What :func:`log_and_register` did: the run, the new registry version, and the duel."""

    run_id: str
    version: str
    promoted: bool
    challenger_score: float
    champion_score: float | None
    previous_champion: str | None


def log_and_register(
    model: RiskModel,
    *,
    tracking_uri: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    dataset_fingerprint: str,
    score_on_test: Callable[[RiskModel], float],
    run_name: str | None = None,
) -> Registration:
    """Log one training run, register its model and move ``champion`` if it wins.

    ``score_on_test(model)`` scores a model on this run's test split (higher is better; the
    trainer passes test PR-AUC). The current champion is scored by the same function when its
    feature-set hash matches; otherwise it cannot read these rows and its recorded
    test PR-AUC (``metrics["model"]["pr_auc"]``) stands in. No champion yet: the new model takes the alias.
    """
    client = _client(tracking_uri)
    challenger = float(score_on_test(model))
    identity = {"dataset_fingerprint": dataset_fingerprint, "feature_set_hash": model.feature_set_hash}
    run_id, version = _log_version(model, tracking_uri, run_name, {**params, **identity}, metrics, identity)
    previous = champion_version(tracking_uri)
    champion_score: float | None = None
    if previous is not None:
        current = RiskModel.load(f"models:/{MODEL_NAME}/{previous}", tracking_uri=tracking_uri)
        if current.feature_set_hash == model.feature_set_hash:
            champion_score = float(score_on_test(current))
        else:
            champion_score = float(current.metrics.get("model", {}).get("pr_auc") or 0.0)
    promoted = previous is None or challenger > champion_score
    if promoted:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, version)
    _tag_version(client, version, {"test_pr_auc": f"{challenger:.6f}", **_threshold_tags(model)})
    return Registration(run_id, version, promoted, challenger, champion_score, previous)


def register_calibrated(model: RiskModel, *, tracking_uri: str, alias: str | None = None) -> str:
    """Register ``model`` (its threshold set by :func:`foreshock.models.calibrate.calibrate`) as a
    new version of the same booster, tagged with the threshold and where it came from; move
    ``alias`` to it when given (a service following ``models:/foreshock-risk@<alias>`` reloads it).
    No duel: a calibration changes what the model spends on one cluster, not how it ranks.
    Returns the version number."""
    source = model.threshold_source
    if source.get("kind") != "calibrate":
        raise ValueError("register_calibrated takes a model whose threshold foreshock calibrate set")
    identity = {"dataset_fingerprint": source["dataset_fingerprint"],
                "feature_set_hash": model.feature_set_hash}
    params = {f"calibration_{k}": v for k, v in source.items()}
    _, version = _log_version(model, tracking_uri, "calibrate", {**params, **identity}, {}, identity)
    client = _client(tracking_uri)
    _tag_version(client, version, _threshold_tags(model))
    if alias:
        client.set_registered_model_alias(MODEL_NAME, alias, version)
    return version


def _threshold_tags(model: RiskModel) -> dict[str, str]:
    """A version's record of its threshold and where it came from (``threshold_source``)."""
    source = model.threshold_source
    tags = {"threshold": f"{model.threshold:.6g}", "threshold_source": str(source.get("kind", "unknown"))}
    for key in ("budget_false_alarms_per_1000_node_days", "confidence", "node_days", "false_alarms",
                "certified", "dataset", "dataset_fingerprint", "labelled", "from_version"):
        if key in source:
            tags[f"threshold_{key}"] = str(source[key])
    return tags


def _log_version(
    model: RiskModel,
    tracking_uri: str,
    run_name: str | None,
    params: dict[str, Any],
    metrics: dict[str, float],
    tags: dict[str, str],
) -> tuple[str, str]:
    """One MLflow run that logs ``model`` (LightGBM text, its JSON as the flavour's metadata) and
    registers it as a new version of :data:`MODEL_NAME`; returns (run id, version)."""
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    experiment_id = _experiment_id(_client(tracking_uri), tracking_uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.log_params(params)
        mlflow.set_tags(tags)
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and v == v})
        info = mlflow.lightgbm.log_model(
            model.booster,
            name="model",
            metadata=model.metadata(),
            pip_requirements=[f"lightgbm=={_lightgbm_version()}"],
        )
        mv = mlflow.register_model(info.model_uri, MODEL_NAME, await_registration_for=0)
    return run.info.run_id, str(mv.version)


def _tag_version(client: MlflowClient, version: str, tags: dict[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(MODEL_NAME, version, key, value)


def log_artifacts(tracking_uri: str, run_id: str, paths: list[Path]) -> None:
    """Attach files written after registration (the report, metrics and plots) to the run."""
    client = _client(tracking_uri)
    for path in paths:
        client.log_artifact(run_id, str(path))


def _lightgbm_version() -> str:
    import lightgbm

    return lightgbm.__version__
