"""Separate heads per failure class against one model of every failure, judged as the model is
judged: equal false-alarm rates, on validation and on unseen seeds.

Both variants are grown by ``foreshock train``'s recipe for trees (its parameters, leaf floor,
monotone directions, forced tail bins, censoring before failures, early stopping on validation
average precision; trees alone and trees boosted from the logistic baseline's log-odds, the one
with the higher validation PR-AUC kept, then Platt-calibrated on validation:
:func:`foreshock.models.train.fit_with_prior`), on the same rows of one dataset's training period,
from the same logistic baseline: ``single``, one model whose positives are the hour before every
failure; ``heads``, one model per class of failure cause (:data:`CLASSES`: memory, link, thermal
and power), each with the hour before its class's failures as positives and every other row a
negative, their probabilities joined as the chance that any class's failure comes,
``1 - prod(1 - p)``. Failures of no class (software, maintenance: no foreshock) are a positive
of ``single`` only. The out-of-fold threshold is left out: each variant is judged on every
failure by PR-AUC and the failures caught at 1, 2, 5 and 10 false alarms per 1,000 node-days,
each at its own threshold on the rows judged (:func:`foreshock.models.evaluate.predictor_metrics`).

    .venv/bin/python benchmarks/class_heads.py --train DIR --pool llama3=DIR,DIR --out runs/heads
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
from history_features import variant_args  # benchmarks/, the script's own folder

from foreshock.models.alerting import EVAL_COLUMNS, EvalRows, after_return
from foreshock.models.baselines import LogisticBaseline
from foreshock.models.evaluate import predictor_metrics
from foreshock.models.frame import FeatureBlock, FeatureRows, LabelledData, build_labelled
from foreshock.models.scored import HeldScores
from foreshock.models.splits import make_split
from foreshock.models.train import (
    CENSOR_MS,
    DEFAULT_PARAMS,
    PRIOR_WEIGHT,
    booster_rows,
    fit_logistic_baseline,
    fit_with_prior,
    min_leaf_rows,
    monotone_directions,
    tail_bin_bounds,
)

HORIZON_MS = 60 * 60_000
RATES = ("1", "2", "5", "10")
VARIANTS = ("single", "heads")
# a failure's class by the words of its cause, as the shipped profiles and a site's tickets name them
CLASSES = {
    "memory": ("memory", "ecc", "hbm"),
    "link": ("nvlink", "network", "nic", "ib_link", "io_expansion", "pcie"),
    "thermal_power": ("thermal", "fan", "airflow", "chassis", "power"),
}


def class_of(causes: pd.Series) -> pd.Series:
    """Each row's failure class by its cause (None for a row of no class, or of no failure)."""
    names = causes.astype("object").fillna("").astype(str)
    out = pd.Series(None, index=causes.index, dtype="object")
    for name, words in CLASSES.items():
        out[out.isna() & names.str.contains("|".join(words))] = name
    return out


def positives(rows: pd.DataFrame, head: str | None) -> np.ndarray:
    """``rows``' labels for ``head`` (None: every failure)."""
    label = rows["label"].to_numpy(dtype=np.int8)
    if head is None:
        return label
    return label & (class_of(rows["cause"]) == head).to_numpy(dtype=np.int8)


@dataclass
class Head:
    """A fitted head: its trees, the weight of the prior's log-odds they start from, its Platt map."""

    booster: lgb.Booster
    weight: float
    platt: tuple[float, float]


def fit_variants(data: LabelledData) -> tuple[dict[str, list[Head]], LogisticBaseline, pd.DataFrame]:
    """Each variant's heads, fitted on ``data``'s training period; the prior; the validation rows."""
    frame = data.frame
    masks = make_split(frame, data.horizon_ms).masks(frame)
    train, val = frame[masks["train"]], frame[masks["val"]]
    rows = booster_rows(train, censor_ms=CENSOR_MS, negative_rate=1.0, seed=0)
    names = data.feature_names
    prior = fit_logistic_baseline(data, train, seed=0)
    params = {**DEFAULT_PARAMS, "min_child_samples": min_leaf_rows(len(rows)),
              "monotone_constraints": monotone_directions(names), "random_state": 0}
    bins = tail_bin_bounds(FeatureRows(rows, names, data))
    fitted: dict[str | None, Head] = {}
    for head in (None, *CLASSES):
        y, y_val = positives(rows, head), positives(val, head)
        if not (y.any() and y_val.any()):  # a head is judged and calibrated on its class's failures
            print(f"no head for {head}: no failure of its class in training or in validation", flush=True)
            continue
        print(f"fitting {head or 'single'}: {int(y.sum()):,} positive rows of {len(y):,}", flush=True)
        choice = fit_with_prior(rows.assign(label=y), val.assign(label=y_val), names, params, prior,
                                PRIOR_WEIGHT, data=data, bins=bins)
        judged = choice.judged[choice.weight]
        fitted[head] = Head(choice.booster, choice.weight, (judged["platt_slope"], judged["platt_intercept"]))
    if None not in fitted or len(fitted) == 1:
        raise SystemExit("the training or validation period holds too few failures for the comparison")
    return {"single": [fitted.pop(None)], "heads": list(fitted.values())}, prior, val


def probability(heads: list[Head], prior: LogisticBaseline, block: FeatureBlock) -> np.ndarray:
    """The chance that any of the heads' failures comes: ``1 - prod(1 - p)``."""
    log_odds = prior.log_odds(block.x)
    quiet = np.ones(len(block.x))
    for head in heads:
        margin = head.booster.predict(block.x, raw_score=True) + head.weight * log_odds
        slope, intercept = head.platt
        quiet *= 1.0 - 1.0 / (1.0 + np.exp(-(slope * margin + intercept)))
    return 1.0 - quiet


def judged(variants: dict[str, list[Head]], prior: LogisticBaseline,
           parts: list[tuple[str, LabelledData, pd.DataFrame]]) -> dict[str, Any]:
    """Each variant's figures on the rows of ``parts`` (name, data, its rows), judged as one pool."""
    frames = []
    for name, data, rows in parts:
        scores = data.scores(rows, {v: partial(probability, heads, prior) for v, heads in variants.items()})
        own = rows[[c for c in EVAL_COLUMNS if c in rows]].assign(after_return=after_return(rows), **scores)
        frames.append(own.assign(node=name + "/" + own["node"].astype(str)))
    pool = pd.concat(frames, ignore_index=True)
    pool["node"] = pool["node"].astype("category")
    eval_rows = EvalRows(pool, parts[0][1].cadence_ms)
    held = HeldScores(eval_rows, {v: eval_rows.frame[v].to_numpy() for v in variants})
    out = {}
    for v in variants:
        m = predictor_metrics(held, v, threshold=1.0)
        at = m["recall_at_false_alarm_rates"]
        out[v] = {"failures": m["failures"], "pr_auc": m["pr_auc"],
                  "caught_at": [at[r]["caught"] for r in RATES]}
    return out


def main() -> None:
    args = variant_args(__doc__)
    train = build_labelled(args.train, HORIZON_MS)
    variants, prior, val = fit_variants(train)
    results = {"validation": judged(variants, prior, [(args.train.name, train, val)])}
    for spec in args.pool:
        pool, dirs = spec.split("=", 1)
        parts = []
        for d in dirs.split(","):
            data = build_labelled(d, HORIZON_MS)
            parts.append((Path(d).name, data, data.frame))
        results[f"{pool} pool"] = judged(variants, prior, parts)
        print(f"judged the {pool} pool", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    print("| judged on (failures) | variant | PR-AUC "
          "| caught at ≤ 1 / 2 / 5 / 10 false alarms per 1,000 node-days |")
    print("|---|---|---|---|")
    for part, result in results.items():
        for v in VARIANTS:
            s = result[v]
            print(f"| {part} ({s['failures']}) | {v} | {s['pr_auc']:.3f} | "
                  f"{' / '.join(str(c) for c in s['caught_at'])} |")


if __name__ == "__main__":
    main()
