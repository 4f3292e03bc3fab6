"""The production :class:`foreshock.predictor.service.EngineFactory`: ``foreshock.features.online``
engines of one feature set."""

from __future__ import annotations

from pathlib import Path

from foreshock.features.spec import FeatureSet
from foreshock.predictor.held import engine_columns

__all__ = ["OnlineEngines"]


class OnlineEngines:
    """Makes :class:`foreshock.features.online.OnlineFeatureEngine` instances for ``feature_set``.

    ``tolerance_ms`` is the engine's allowance for out-of-order records (see its docstring).
    """

    def __init__(self, feature_set: FeatureSet, tolerance_ms: int = 60_000):
        self.feature_set = feature_set
        self.feature_set_hash = feature_set.hash
        self.tick_ms = feature_set.bucket_ms
        self.tolerance_ms = tolerance_ms
        self.columns = engine_columns(feature_set)

    def new(self):
        from foreshock.features.online import OnlineFeatureEngine

        return OnlineFeatureEngine(self.feature_set, tolerance_ms=self.tolerance_ms)

    def load(self, path: Path):
        from foreshock.features.online import OnlineFeatureEngine

        return OnlineFeatureEngine.load(path, self.feature_set)

    def snapshot_space(self):
        from foreshock.features.online import FloatSpace

        return FloatSpace()
