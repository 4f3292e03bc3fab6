"""How hard were a dataset's foreshocks to warn early? A predictor's lead beside an intensity oracle.

The simulator gives each foreshock a strength ``s`` (ground truth's ``precursor_strength``) and a
length ``L`` (from ``precursor_start_ms`` to the failure). Its intensity rises as
``s * (elapsed / L) ** 2`` and peaks at the failure, while the harmless transients on healthy
nodes peak at no more than the profile's ``false_alarm_strength`` (0.6) and grow the same way.
The *intensity oracle* reads each foreshock's true intensity, free of the counters' Poisson
noise, and alerts once it crosses ``theta``: it warns ``L * (1 - sqrt(theta / s))`` ahead when
``s > theta`` (capped at the horizon, as a predictor's first alerting row inside it is).

Set ``theta`` so that the oracle catches as many detectable failures as the predictor did, and
its median lead says how early the failures of a dataset can be warned at that recall from
their strength alone: a measure of how hard a dataset's foreshocks are, so that a predictor's
short median on one dataset can be set against its medians on others. It is no bound: a
predictor alerts on a noisy score, which first crosses its threshold before its mean does, and
it need not catch the strongest foreshocks first (on every simulated dataset in
``models/README.md`` the model warns earlier than the oracle). The oracle alerts at any instant
while a predictor alerts at its rows (one a minute by default), which favours the oracle by
about half a cadence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from foreshock.models.alerting import WARNING_MINUTES, EvalRows

__all__ = ["intensity_oracle", "against_oracle"]


def intensity_oracle(truth: pd.DataFrame, caught: int, horizon_minutes: float) -> dict:
    """The oracle that catches ``caught`` of the failures in ``truth`` (ground-truth rows of
    detectable failures: ``ts``, ``precursor_start_ms``, ``precursor_strength``): its ``theta``,
    how many it catches (fewer only where strengths tie at ``theta``), their median lead and
    how many it warns at least :data:`~foreshock.models.alerting.WARNING_MINUTES` ahead."""
    if "precursor_strength" not in truth.columns:
        raise ValueError(
            "the ground truth has no precursor_strength: the dataset was simulated before it was "
            "recorded; simulate it again (same arguments, same failures)"
        )
    strength = truth["precursor_strength"].to_numpy(dtype=float)
    length = (truth["ts"].to_numpy(dtype=float) - truth["precursor_start_ms"].to_numpy(dtype=float)) / 60_000
    ranked = np.sort(strength)[::-1]
    theta = float(ranked[caught]) if caught < ranked.size else 0.0
    hit = strength > theta
    lead = np.minimum(length[hit] * (1.0 - np.sqrt(theta / strength[hit])), horizon_minutes)
    return {
        "theta": theta,
        "caught": int(hit.sum()),
        "median_lead_minutes": float(np.median(lead)) if lead.size else None,
        "caught_15_minutes_ahead": int(np.count_nonzero(lead >= WARNING_MINUTES)),
    }


def against_oracle(
    rows: EvalRows, score: np.ndarray, threshold: float, truth: pd.DataFrame, horizon_minutes: float
) -> pd.DataFrame:
    """The predictor at ``threshold`` on ``rows`` and the oracle catching as many of the same
    detectable failures (``truth``: :func:`foreshock.ingest.dataset.read_ground_truth` of a simulated
    dataset): detectable failures caught, median lead and warnings 15 minutes ahead, one row each."""
    detectable = rows.failures[rows.failures["detectable"].eq(True)][["node", "failure_ts"]]
    judged = detectable.astype({"failure_ts": "int64"}).merge(
        truth.astype({"ts": "int64"}), left_on=["node", "failure_ts"], right_on=["node", "ts"], how="inner"
    )
    if len(judged) != len(detectable):
        raise ValueError("some detectable failures of these rows are not in the ground truth")
    own = rows.at_threshold(score, threshold)
    caught = own["recall_by_detectability"].get("detectable", {}).get("caught", 0)
    table = pd.DataFrame.from_dict(
        {
            "predictor": {
                "caught": caught,
                "median_lead_minutes": own["median_lead_minutes_detectable"],
                "caught_15_minutes_ahead": own["caught_15_minutes_ahead"],
                "theta": None,
            },
            "intensity oracle": intensity_oracle(judged, caught, horizon_minutes),
        },
        orient="index",
    )
    table.insert(0, "detectable", len(judged))
    return table
