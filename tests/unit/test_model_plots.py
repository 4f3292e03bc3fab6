"""The precision-recall plot draws a curve of every distinct score at the resolution of a plot."""

from __future__ import annotations

import numpy as np
import pandas as pd

from foreshock.models.plots import _on_pixels


def test_a_curve_keeps_its_ends_and_each_columns_extremes():
    rng = np.random.default_rng(1)
    recall = np.sort(rng.random(1_000_000))[::-1]
    precision = np.clip(0.5 + np.cumsum(rng.normal(0, 0.001, recall.size)), 0, 1)
    x, y = _on_pixels(recall, precision, pixels=500)
    assert len(x) <= 4 * 501
    assert (x[0], y[0], x[-1], y[-1]) == (recall[0], precision[0], recall[-1], precision[-1])
    assert np.all(np.diff(x) <= 0)  # in the curve's order
    full = pd.Series(precision).groupby(np.round(recall * 500)).agg(["min", "max", "first", "last"])
    drawn = pd.Series(y).groupby(np.round(x * 500)).agg(["min", "max", "first", "last"])
    pd.testing.assert_frame_equal(drawn, full)
