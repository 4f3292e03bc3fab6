"""Feature definitions, the batch engine and the online engine: one spec, two executors.

``FeatureSet``/``Feature`` declare features (:mod:`foreshock.features.spec`); :data:`DEFAULT_FEATURE_SET`
is the shipped set; :func:`foreshock.features.batch.compute_features` builds the training table from
parquet telemetry and :class:`foreshock.features.online.OnlineFeatureEngine` serves the same features
from a stream.
"""

from foreshock.features.default_set import DEFAULT_FEATURE_SET
from foreshock.features.spec import Feature, FeatureSet, PeerFeature

__all__ = ["DEFAULT_FEATURE_SET", "Feature", "FeatureSet", "PeerFeature"]
