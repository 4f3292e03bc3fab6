"""The intensity oracle: how early a detector that read each foreshock's true intensity could warn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.models.alerting import EvalRows
from foreshock.models.analysis.lead_bound import against_oracle, intensity_oracle

MIN = 60_000


def _truth(strengths, lengths_min, failure_min=200):
    n = len(strengths)
    return pd.DataFrame(
        {
            "node": [f"n{i}" for i in range(n)],
            "ts": [failure_min * MIN] * n,
            "precursor_start_ms": [(failure_min - length) * MIN for length in lengths_min],
            "precursor_strength": strengths,
        }
    )


def test_the_oracle_catches_the_strongest_foreshocks_and_warns_where_their_intensity_crosses_theta():
    truth = _truth([2.0, 1.0, 0.5], [100, 100, 100])
    two = intensity_oracle(truth, caught=2, horizon_minutes=60)
    # theta is the third strength: s * (elapsed / L)**2 = 0.5 at L * sqrt(0.5 / s) into the foreshock
    lead = [100 * (1 - np.sqrt(0.25)), 100 * (1 - np.sqrt(0.5))]  # 50.0 and 29.3 min
    assert two["theta"] == 0.5 and two["caught"] == 2
    assert two["median_lead_minutes"] == pytest.approx(np.median(lead))
    assert two["caught_15_minutes_ahead"] == 2
    capped = intensity_oracle(truth, caught=2, horizon_minutes=40)  # an alert before the horizon is no catch
    assert capped["median_lead_minutes"] == pytest.approx(np.median([40.0, lead[1]]))
    one = intensity_oracle(truth, caught=1, horizon_minutes=60)
    assert one["theta"] == 1.0 and one["caught"] == 1
    assert one["median_lead_minutes"] == pytest.approx(100 * (1 - np.sqrt(0.5)))
    none = intensity_oracle(truth, caught=0, horizon_minutes=60)
    assert none["caught"] == none["caught_15_minutes_ahead"] == 0 and none["median_lead_minutes"] is None
    every = intensity_oracle(_truth([1.0, 1.0], [10, 30]), caught=5, horizon_minutes=60)
    assert every["theta"] == 0.0 and every["median_lead_minutes"] == pytest.approx(20.0)
    assert every["caught_15_minutes_ahead"] == 1


def test_a_dataset_simulated_before_strengths_were_recorded_is_refused():
    with pytest.raises(ValueError, match="simulate it again"):
        intensity_oracle(_truth([1.0], [60]).drop(columns="precursor_strength"), 1, 60)


def test_against_oracle_sets_the_oracle_to_the_predictors_catches_on_the_same_failures():
    """Two detectable failures at minute 200 (rows from minute 140 positive): the predictor
    alerts on n0 from minute 170 (30 min ahead) and misses n1, so the oracle catches one too,
    the stronger foreshock, from where its intensity crosses the weaker one's strength."""
    rows = []
    for node in ("n0", "n1", "n2"):
        for m in range(200):
            positive = node != "n2" and m >= 140
            rows.append((node, m * MIN, int(positive), 200 * MIN if positive else pd.NA,
                         "gpu" if positive else None, True if positive else None))
    frame = pd.DataFrame(rows, columns=["node", "ts", "label", "failure_ts", "cause", "detectable"])
    evaluated = EvalRows(frame, MIN)
    score = ((evaluated.frame["node"] == "n0") & (evaluated.frame["ts"] >= 170 * MIN)).to_numpy(float)
    truth = _truth([0.9, 1.6], [100, 100]).assign(node=["n1", "n0"])
    table = against_oracle(evaluated, score, 0.5, truth, 60)
    assert list(table.index) == ["predictor", "intensity oracle"]
    assert table["detectable"].tolist() == [2, 2]
    assert table.loc["predictor", "caught"] == 1 and table.loc["predictor", "median_lead_minutes"] == 30.0
    assert table.loc["intensity oracle", "caught"] == 1 and table.loc["intensity oracle", "theta"] == 0.9
    assert table.loc["intensity oracle", "median_lead_minutes"] == pytest.approx(25.0)  # 100 * (1 - 0.75)
    with pytest.raises(ValueError, match="not in the ground truth"):
        against_oracle(evaluated, score, 0.5, truth.iloc[:1], 60)
