"""From a dataset folder to the labelled frame every predictor is trained and judged on.

One frame holds, per (node, ts) at the feature cadence: the model's features, the label and the
next failure's cause (:mod:`foreshock.models.labels`), and the raw-telemetry evidence the rule baseline
reads (:func:`foreshock.models.baselines.rule_inputs`). Every predictor scores exactly these rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foreshock.ingest.dataset import read_events, read_manifest
from foreshock.models.baselines import rule_inputs
from foreshock.models.labels import label_rows

__all__ = ["LabelledData", "build_labelled", "combined_fingerprint", "dataset_fingerprint"]


@dataclass
class LabelledData:
    """The labelled frame and what it was made from."""

    frame: pd.DataFrame
    feature_names: list[str]
    feature_set_hash: str
    cadence_ms: int
    horizon_ms: int
    manifest: dict[str, Any]
    fingerprint: str


def dataset_fingerprint(data_dir: str | Path) -> str:
    """sha256 over the manifest, the events table and every part's name and size (cheap, and
    changes whenever the simulator writes different data)."""
    data_dir = Path(data_dir)
    h = hashlib.sha256((data_dir / "manifest.json").read_bytes())
    events = data_dir / "events.parquet"
    if events.exists():
        h.update(events.read_bytes())
    for path in sorted(data_dir.glob("*/part-*.parquet")):
        h.update(f"{path.relative_to(data_dir)}:{path.stat().st_size};".encode())
    return h.hexdigest()[:16]


def combined_fingerprint(fingerprints: list[str]) -> str:
    """One fingerprint for datasets judged together, in the order given."""
    return hashlib.sha256(";".join(fingerprints).encode()).hexdigest()[:16]


def feature_set_identity(features: pd.DataFrame, feature_set: Any = None) -> str:
    """The hash of the feature set ``features`` was computed with: ``feature_set.hash``, or the
    table's own ``attrs["feature_set_hash"]`` (a table built outside a :class:`FeatureSet`, as
    the tests' synthetic columns, names its identity there). A table of unknown identity is an
    error: a model must never record a hash its features do not have."""
    if feature_set is not None:
        return str(feature_set.hash)
    if "feature_set_hash" in features.attrs:
        return str(features.attrs["feature_set_hash"])
    raise ValueError("features given without their feature set: pass feature_set, or name the table's "
                     "identity in features.attrs['feature_set_hash']")


def build_labelled(
    data_dir: str | Path,
    horizon_ms: int,
    cadence_ms: int = 60_000,
    feature_set: Any = None,
    features: pd.DataFrame | None = None,
    dask_address: str | None = None,
) -> LabelledData:
    """Compute features (or take ``features``: node, ts, feature columns), label them, and attach
    the rule evidence. ``feature_set`` defaults to ``foreshock.features.DEFAULT_FEATURE_SET``. With a Dask
    scheduler address the features are computed there, a group of nodes per task, so the raw
    telemetry never has to fit in this process.

    The frame holds the features as float32, half the memory of the engines' float64: one row a
    minute for 512 nodes over 14 days is 10 million rows, 4 GB of features instead of 8. LightGBM
    bins them anyway: its splits fall midway between the values seen in training, so a float64
    value scored online lands on the side of every split its float32 rounding does, bar values
    within float32 precision (1 part in 10 million) of a split."""
    manifest = read_manifest(data_dir)
    if features is None:
        from foreshock.features import DEFAULT_FEATURE_SET
        from foreshock.features.batch import compute_features, compute_features_dask

        feature_set = feature_set if feature_set is not None else DEFAULT_FEATURE_SET
        if dask_address is None:
            features = compute_features(data_dir, feature_set=feature_set, cadence_ms=cadence_ms)
        else:
            features = compute_features_dask(
                data_dir, dask_address, feature_set=feature_set, cadence_ms=cadence_ms
            )
        names, fs_hash = list(feature_set.names), str(feature_set.hash)
    else:
        names = [c for c in features.columns if c not in ("node", "ts")]
        fs_hash = feature_set_identity(features, feature_set)
    rows = pd.DataFrame(features[names].to_numpy(dtype=np.float32, na_value=np.nan), columns=names)
    rows.insert(0, "node", features["node"].astype(str).to_numpy())
    rows.insert(1, "ts", features["ts"].to_numpy(dtype=np.int64))
    del features  # the float64 table, freed here when computed here, before labelling copies rows
    frame = label_rows(rows, read_events(data_dir), horizon_ms, end_ms=int(manifest["end_ms"]))
    frame = pd.concat([frame, rule_inputs(data_dir, frame, cadence_ms)], axis=1)
    return LabelledData(
        frame, names, fs_hash, cadence_ms, horizon_ms, manifest, dataset_fingerprint(data_dir)
    )
