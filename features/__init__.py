"""Feature definitions, the batch engine and the online engine: one spec, two executors.

``FeatureSet``/``Feature`` declare features (:mod:`features.spec`); :data:`DEFAULT_FEATURE_SET`
is the shipped set; :func:`features.batch.compute_features` builds the training table from
parquet telemetry and :class:`features.online.OnlineFeatureEngine` serves the same features
from a stream.
"""

from features.default_set import DEFAULT_FEATURE_SET
from features.spec import Feature, FeatureSet, PeerFeature

__all__ = ["DEFAULT_FEATURE_SET", "Feature", "FeatureSet", "PeerFeature"]
