"""Where the service's model comes from, and the rule it must pass before it scores anything.

A model is accepted only when the hash of the feature set it was trained on equals the hash of
the feature set the online engine computes: same names, same windows, same aggregations. A
mismatch at start is an error; a mismatching new champion is refused and the old model stays.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from foreshock.models.artifact import RiskModel

__all__ = ["ModelSource", "RegistryModelSource", "PathModelSource", "ModelMismatchError", "check_model",
           "model_source"]

log = logging.getLogger(__name__)


class ModelMismatchError(ValueError):
    """The model was trained on another feature set than the one this service computes."""


def check_model(model: RiskModel, feature_set_hash: str) -> RiskModel:
    """Return ``model`` if it reads this service's feature set; raise :class:`ModelMismatchError` if not."""
    if model.feature_set_hash != feature_set_hash:
        raise ModelMismatchError(
            f"model {model.version or '(unversioned)'} was trained on feature set {model.feature_set_hash}, "
            f"this service computes feature set {feature_set_hash}; retrain or serve a matching model"
        )
    return model


class ModelSource(Protocol):
    """``version()`` is cheap and polled; ``load()`` fetches the model it names."""

    def version(self) -> str | None: ...

    def load(self) -> RiskModel: ...


@dataclass(frozen=True)
class RegistryModelSource:
    """A registered model, ``models:/name@alias`` or ``models:/name/N``; an alias can move."""

    uri: str
    tracking_uri: str

    def version(self) -> str | None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        ref = self.uri.removeprefix("models:/")
        if "@" not in ref:
            return ref.rsplit("/", 1)[1]
        name, alias = ref.split("@", 1)
        client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        try:
            return str(client.get_model_version_by_alias(name, alias).version)
        except MlflowException:
            return None

    def load(self) -> RiskModel:
        return RiskModel.load(self.uri, tracking_uri=self.tracking_uri)


@dataclass(frozen=True)
class PathModelSource:
    """A model folder on disk (``RiskModel.save`` output or ``foreshock train --out``); never moves."""

    path: Path

    def version(self) -> str | None:
        return None

    def load(self) -> RiskModel:
        return RiskModel.load(self.path)


def model_source(model: str, tracking_uri: str | None) -> ModelSource:
    """``models:/…`` names a registered model (needs ``tracking_uri``); anything else is a path."""
    if model.startswith("models:/"):
        if not tracking_uri:
            raise ValueError(f"{model} needs an MLflow tracking URI")
        return RegistryModelSource(model, tracking_uri)
    return PathModelSource(Path(model))
