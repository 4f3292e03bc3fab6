"""What a node's own history buys the model, judged as the model is judged: equal false-alarm rates,
unseen seeds.

Two variants, trained alike on one dataset (:func:`foreshock.models.train.train_on`, the defaults of
``foreshock train``) and judged alike on pools of datasets neither saw
(:func:`foreshock.models.evaluate.evaluate`): ``base``, the shipped feature set, and ``history``, the
shipped set plus the node's failures in the last 7 and 30 days and the time since its last return
(:data:`HISTORY`, computed by both engines from ``node.events``). The features are computed once,
with every column of both, and each variant reads its own; logistic regression is fitted on the
variant's columns too. It prints, per variant and predictor, PR-AUC, the failures caught at 1, 2, 5
and 10 false alarms per 1,000 node-days (each at its own threshold on those rows), and at the
operating threshold chosen in training, with the false alarms it spent.

    .venv/bin/python benchmarks/history_features.py --train DIR --pool refault=DIR,DIR --out runs/history
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from foreshock.features.default_set import DEFAULT_FEATURE_SET
from foreshock.features.spec import Feature, FeatureSet
from foreshock.models.evaluate import evaluate
from foreshock.models.frame import LabelledData, build_labelled
from foreshock.models.train import train_on

DAY = 24 * 3_600_000
HISTORY = (
    Feature("node", "failed", "count", 7 * DAY),
    Feature("node", "failed", "count", 30 * DAY),
    Feature("node", "returned", "since", 30 * DAY),
)
RATES = ("1", "2", "5", "10")
PREDICTORS = ("model", "logistic")


def with_history() -> FeatureSet:
    return dataclasses.replace(DEFAULT_FEATURE_SET, features=(*DEFAULT_FEATURE_SET.features, *HISTORY))


def restrict(data: LabelledData, fs: FeatureSet) -> LabelledData:
    """The labelled rows with ``fs``'s feature columns only, held in the frame (read from the
    feature cache ``data`` reads them from), under ``fs``'s identity."""
    frame = data.with_features(data.frame)
    drop = [n for n in (*data.feature_names, "_src") if n in frame.columns and n not in set(fs.names)]
    return dataclasses.replace(data, frame=frame.drop(columns=drop), feature_names=list(fs.names),
                               feature_set_hash=fs.hash, table=None, days=[])


def summary(m: dict[str, Any]) -> dict[str, Any]:
    at = m.get("recall_at_false_alarm_rates", {})
    return {"failures": m["failures"], "pr_auc": m["pr_auc"], "caught": m["caught"],
            "false_alarms": m["false_alarms"], "rate": m["false_alarms_per_1000_node_days"],
            "lead": m.get("median_lead_minutes_detectable"),
            "caught_at": [at.get(r, {}).get("caught") for r in RATES]}


def run_variant(name: str, fs: FeatureSet, train: LabelledData, pools: dict, out: Path) -> dict[str, Any]:
    out = out / name
    model, metrics, _ = train_on(restrict(train, fs))
    model.save(out / "model")
    result = {"held-out period": {p: summary(metrics[p]) for p in PREDICTORS}}
    for pool, members in pools.items():
        judged = evaluate(model, [d for d, _ in members], out / f"pool-{pool}",
                          data=[restrict(data, fs) for _, data in members])
        result[f"pool {pool}"] = {p: summary(judged[p]) for p in PREDICTORS}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    return result


def variant_args(doc: str) -> argparse.Namespace:
    """The command line of a comparison of variants: ``--train DIR``, ``--pool NAME=DIR[,DIR...]``
    (repeated) and ``--out DIR``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--train", type=Path, required=True, help="dataset folder to train on")
    parser.add_argument("--pool", action="append", default=[], help="NAME=DIR[,DIR...]: unseen datasets")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def compare(args: argparse.Namespace, variants: dict[str, FeatureSet]) -> None:
    """Train each variant on ``args.train`` and judge it on ``args.pool``, then print the table.
    The features are computed once, with the columns of the last variant, which must hold every
    other variant's."""
    full = list(variants.values())[-1]
    horizon = 60 * 60_000
    train = build_labelled(args.train, horizon, feature_set=full)
    pools = {name: [(Path(d), build_labelled(d, horizon, feature_set=full)) for d in dirs.split(",")]
             for name, dirs in (spec.split("=", 1) for spec in args.pool)}
    results = {name: run_variant(name, fs, train, pools, args.out) for name, fs in variants.items()}
    print("| judged on | variant | predictor | PR-AUC | caught at ≤ 1 / 2 / 5 / 10 false alarms per 1,000 "
          "node-days | caught at the operating threshold | false alarms (/1,000 node-days) | median lead, "
          "detectable |")
    print("|---|---|---|---|---|---|---|---|")
    for part in results[next(iter(variants))]:
        for name, result in results.items():
            for p in PREDICTORS:
                s = result[part][p]
                lead = "-" if s["lead"] is None else f"{s['lead']:.1f} min"
                print(f"| {part} ({s['failures']} failures) | {name} | {p} | {s['pr_auc']:.3f} | "
                      f"{' / '.join(str(c) for c in s['caught_at'])} | {s['caught']} | "
                      f"{s['false_alarms']} ({s['rate']:.2f}) | {lead} |")


def main() -> None:
    compare(variant_args(__doc__), {"base": DEFAULT_FEATURE_SET, "history": with_history()})


if __name__ == "__main__":
    main()
