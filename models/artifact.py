"""The trained risk model as the predictor, the mitigator and the notebooks use it.

A :class:`RiskModel` is a LightGBM booster (optionally boosted on top of a weighted logistic
regression, its *linear prior*) plus everything needed to turn its raw score into an
operator-facing decision: the ordered feature names and the hash of the feature set they came
from (the predictor refuses a model whose hash differs from its own), a Platt calibration of the
margin (fitted on the validation split, so ``predict_proba`` is a probability of failing
within ``horizon_minutes``), the alert threshold chosen for the false-alarm budget and where it
came from (``threshold_source``: training's out-of-fold selection, or ``foreshock calibrate`` on
a cluster's own telemetry), the metrics measured when it was trained, and the fitted parameters
of the baselines it was compared with.

Saved form (no pickles): ``model.txt`` (LightGBM's own text format) and ``risk_model.json``
(which holds the linear prior's coefficients). Inside MLflow the booster is logged through the
lightgbm flavour (``model.lgb``, text) and the same JSON travels as the flavour's ``metadata`` in
the ``MLmodel`` file. The flavour's own ``pyfunc`` scores the trees alone, without the prior and
the calibration: load a model with :meth:`RiskModel.load`, as the predictor does.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from foreshock.models.baselines import LogisticBaseline

__all__ = ["RiskModel", "MODEL_FILE", "META_FILE", "NEVER_ALERT"]

MODEL_FILE = "model.txt"
META_FILE = "risk_model.json"
_MLFLOW_MODEL_FILE = "model.lgb"
_FORMAT = 2
# the threshold above every probability: a budget that no alert at all can keep (a score of
# exactly 1.0 would still alert at 1.0)
NEVER_ALERT = float(np.nextafter(1.0, 2.0))
_READABLE_FORMATS = (1, 2)  # format 1: no linear prior


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -500.0, 500.0)))


class RiskModel:
    """A calibrated LightGBM failure-risk model for one feature set and one horizon.

    ``margin`` is the booster's raw log-odds score plus ``prior_weight`` times the log-odds of
    ``prior``, a logistic regression on the same features whose log-odds the trees were boosted
    from (LightGBM ``init_score``): the trees add what the linear model misses, and the linear
    part keeps rising with an error counter past the trees' last split. ``calibration`` is
    ``(a, b)``: ``P(fail within H) = sigmoid(a * margin + b)``. The map is strictly increasing
    (``a > 0``), so ranking metrics are the margin's own and SHAP contributions (which add up to
    the margin) keep their sign. ``threshold`` applies to the calibrated probability.
    """

    def __init__(
        self,
        booster: lgb.Booster,
        *,
        feature_names: list[str],
        feature_set_hash: str,
        threshold: float,
        horizon_minutes: int = 60,
        calibration: tuple[float, float] = (1.0, 0.0),
        version: str = "",
        metrics: dict[str, Any] | None = None,
        baselines: dict[str, Any] | None = None,
        prior: LogisticBaseline | None = None,
        prior_weight: float = 0.0,
        threshold_source: dict[str, Any] | None = None,
    ) -> None:
        if list(booster.feature_name()) != list(feature_names):
            raise ValueError("booster features differ from feature_names")
        if prior is not None and prior.feature_names != list(feature_names):
            raise ValueError("the linear prior's features differ from feature_names")
        if calibration[0] <= 0:
            raise ValueError("calibration slope must be positive (a monotone map)")
        if not 0.0 <= threshold <= NEVER_ALERT:
            raise ValueError(f"threshold {threshold} is not a probability (nor {NEVER_ALERT!r}: never alert)")
        self.booster = booster
        self.feature_names = list(feature_names)
        self.feature_set_hash = feature_set_hash
        self.threshold = float(threshold)
        self.horizon_minutes = int(horizon_minutes)
        self.calibration = (float(calibration[0]), float(calibration[1]))
        self.version = version
        self.metrics = dict(metrics or {})
        self.baselines = dict(baselines or {})
        self.prior = prior if prior_weight > 0 else None
        self.prior_weight = float(prior_weight) if self.prior is not None else 0.0
        self.threshold_source = dict(threshold_source or {})

    # ---- scoring -------------------------------------------------------------------------
    def matrix(self, frame: pd.DataFrame | np.ndarray) -> np.ndarray:
        """The frame's feature columns in training order as float64 (missing values stay NaN).

        A DataFrame may carry extra columns (node, ts, labels); a missing feature is an error.
        """
        if isinstance(frame, np.ndarray):
            if frame.ndim != 2 or frame.shape[1] != len(self.feature_names):
                raise ValueError(f"expected {len(self.feature_names)} feature columns, got {frame.shape}")
            return frame.astype(np.float64, copy=False)
        missing = [n for n in self.feature_names if n not in frame.columns]
        if missing:
            raise KeyError(f"frame lacks model features: {missing}")
        return frame[self.feature_names].to_numpy(dtype=np.float64, na_value=np.nan)

    def margin(self, frame: pd.DataFrame | np.ndarray) -> np.ndarray:
        """The log-odds score per row before calibration: trees plus the weighted linear prior."""
        return self.margin_of_matrix(self.matrix(frame))

    def margin_of_matrix(self, x: np.ndarray, prior_log_odds: np.ndarray | None = None) -> np.ndarray:
        """:meth:`margin` of a :meth:`matrix`; ``prior_log_odds``: the prior's log-odds of its
        rows, when the caller has them already."""
        trees = np.asarray(self.booster.predict(x, raw_score=True), dtype=np.float64)
        if self.prior is None:
            return trees
        if prior_log_odds is None:
            prior_log_odds = self.prior.log_odds(x)
        return trees + self.prior_weight * prior_log_odds

    def predict_proba(self, frame: pd.DataFrame | np.ndarray) -> np.ndarray:
        """Calibrated probability that each row's node fails within ``horizon_minutes``."""
        return self.calibrated(self.margin(frame))

    def calibrated(self, margin: np.ndarray) -> np.ndarray:
        """The calibrated probability of each :meth:`margin`."""
        a, b = self.calibration
        return _sigmoid(a * margin + b)

    def alerts(self, frame: pd.DataFrame | np.ndarray) -> np.ndarray:
        """Boolean alert per row: calibrated probability at or above ``threshold``."""
        return self.predict_proba(frame) >= self.threshold

    def contributions(self, frame: pd.DataFrame | np.ndarray) -> np.ndarray:
        """SHAP values: rows x (features + 1), last column the bias; each row sums to
        :meth:`margin`. The trees' come from LightGBM's ``pred_contrib``, to which the weighted
        linear prior adds its own (exact for a linear model: coefficient times standardised
        input, its intercept to the bias)."""
        x = self.matrix(frame)
        contrib = np.asarray(self.booster.predict(x, pred_contrib=True), dtype=np.float64)
        if self.prior is not None:
            contrib[:, :-1] += self.prior_weight * self.prior.terms(x)
            contrib[:, -1] += self.prior_weight * self.prior.intercept_
        return contrib

    def top_features(
        self, frame: pd.DataFrame | np.ndarray, k: int = 5
    ) -> list[list[tuple[str, float | None, float]]]:
        """Per row, the ``k`` features that push its risk most (largest |SHAP|), as
        ``(name, value, contribution)``; ``value`` is ``None`` where the feature is missing."""
        x = self.matrix(frame)
        contrib = self.contributions(x)[:, :-1]
        order = np.argsort(-np.abs(contrib), axis=1, kind="stable")[:, :k]
        out: list[list[tuple[str, float | None, float]]] = []
        for i, idx in enumerate(order):
            row = []
            for j in idx:
                value = None if np.isnan(x[i, j]) else float(x[i, j])
                row.append((self.feature_names[j], value, float(contrib[i, j])))
            out.append(row)
        return out

    def with_threshold(
        self, threshold: float, baselines: dict[str, Any] | None = None, source: dict[str, Any] | None = None
    ) -> RiskModel:
        """The same model alerting at ``threshold`` (and with ``baselines`` and the
        ``threshold_source`` when given), validated as any new model is."""
        meta = {**self.metadata(), "threshold": threshold}
        if baselines is not None:
            meta["baselines"] = baselines
        if source is not None:
            meta["threshold_source"] = source
        return RiskModel.from_parts(self.booster, meta)

    # ---- persistence ---------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """Everything but the booster, as JSON-ready data (the ``risk_model.json`` content)."""
        return {
            "format": _FORMAT,
            "feature_names": self.feature_names,
            "feature_set_hash": self.feature_set_hash,
            "threshold": self.threshold,
            "horizon_minutes": self.horizon_minutes,
            "calibration": list(self.calibration),
            "version": self.version,
            "metrics": self.metrics,
            "baselines": self.baselines,
            "linear_prior": None
            if self.prior is None
            else {"weight": self.prior_weight, **self.prior.to_json()},
            "threshold_source": self.threshold_source,
        }

    @classmethod
    def from_parts(cls, booster: lgb.Booster, meta: dict[str, Any], version: str | None = None) -> RiskModel:
        """Rebuild from a booster and :meth:`metadata` output (``version`` overrides the stored one)."""
        if meta.get("format") not in _READABLE_FORMATS:
            raise ValueError(f"unknown risk model format {meta.get('format')!r}")
        prior = meta.get("linear_prior")
        return cls(
            booster,
            feature_names=list(meta["feature_names"]),
            feature_set_hash=meta["feature_set_hash"],
            threshold=meta["threshold"],
            horizon_minutes=meta["horizon_minutes"],
            calibration=tuple(meta["calibration"]),
            version=meta.get("version", "") if version is None else version,
            metrics=meta.get("metrics"),
            baselines=meta.get("baselines"),
            prior=None if prior is None else LogisticBaseline.from_json(prior),
            prior_weight=0.0 if prior is None else float(prior["weight"]),
            threshold_source=meta.get("threshold_source"),
        )

    def save(self, directory: str | Path) -> Path:
        """Write ``model.txt`` and ``risk_model.json`` into ``directory`` (created); returns it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(directory / MODEL_FILE))
        (directory / META_FILE).write_text(json.dumps(self.metadata(), indent=1, sort_keys=True))
        return directory

    @classmethod
    def load(cls, path_or_uri: str | Path, tracking_uri: str | None = None) -> RiskModel:
        """Load from a ``models:/`` URI (``models:/foreshock-risk@champion``, ``models:/name/3``),
        a directory :meth:`save` wrote, the ``--out`` folder of ``foreshock train`` (its ``model/``),
        or a downloaded MLflow lightgbm-flavour model folder.

        For a registered model, ``version`` becomes the registry's version number.
        """
        text = str(path_or_uri)
        if text.startswith("models:/"):
            from foreshock.models.registry import download_registered

            with tempfile.TemporaryDirectory(prefix="foreshock-model-") as tmp:
                local, version = download_registered(text, tracking_uri, Path(tmp))
                return cls._load_dir(local, version=version)
        return cls._load_dir(Path(text))

    @classmethod
    def _load_dir(cls, directory: Path, version: str | None = None) -> RiskModel:
        if (directory / "model" / META_FILE).exists():
            directory = directory / "model"
        if (directory / META_FILE).exists():
            meta = json.loads((directory / META_FILE).read_text())
            return cls.from_parts(lgb.Booster(model_file=str(directory / MODEL_FILE)), meta, version)
        if (directory / "MLmodel").exists():
            from mlflow.models import Model

            meta = Model.load(str(directory / "MLmodel")).metadata or {}
            return cls.from_parts(lgb.Booster(model_file=str(directory / _MLFLOW_MODEL_FILE)), meta, version)
        raise FileNotFoundError(f"no risk model in {directory} (expected {META_FILE} or MLmodel)")
