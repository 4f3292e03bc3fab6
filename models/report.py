"""The metrics table (markdown for ``report.md`` and the README, rich for the console)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["TABLE_COLUMNS", "metrics_table", "write_report", "print_table", "threshold_text"]

_LONG_SETTINGS = ("split", "threshold_selection", "threshold_source")  # shown in their own sections

PREDICTORS = ("model", "rules", "logistic")
TABLE_COLUMNS = (
    ("pr_auc", "PR-AUC"),
    ("roc_auc", "ROC-AUC"),
    ("recall_at_budget", "recall@budget (failures)"),
    ("precision_at_budget", "precision@budget (episodes)"),
    ("false_alarms_per_1000_node_days", "false alarms /1000 node-days"),
    ("budget_spent", "spent / budget"),
    ("median_lead_minutes", "median lead, 95 % interval (min)"),
    ("caught_15_minutes_ahead", "detectable caught ≥ 15 min ahead"),
    ("detectable_recall", "recall, detectable"),
    ("undetectable_recall", "recall, undetectable"),
)


def _cell(key: str, m: dict[str, Any]) -> str:
    if key.endswith("detectable_recall"):
        group = m.get("recall_by_detectability", {}).get(key.removesuffix("_recall"))
        return f"{group['recall']:.2f} ({group['caught']}/{group['failures']})" if group else "-"
    value = m.get(key)
    if value is None:
        return "-"
    if key == "recall_at_budget":
        return f"{value:.2f} ({m['caught']}/{m['failures']})"
    if key == "budget_spent":
        return f"{value:.2f}"
    if key == "median_lead_minutes" and m.get("median_lead_minutes_ci95"):
        low, high = m["median_lead_minutes_ci95"]
        return f"{value:.1f} ({low:.1f}–{high:.1f})"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _parts(metrics: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """part name -> predictor -> metrics; the top level is the main part (test, or the evaluation
    data pooled), then the other splits of training or each dataset of a pooled evaluation."""
    main = "test" if metrics.get("_info", {}).get("kind") == "train" else "evaluation"
    parts = {main: {p: metrics[p] for p in PREDICTORS}}
    for key in ("by_split", "by_dataset"):
        for part in metrics["model"].get(key, {}):
            parts[part] = {p: metrics[p][key][part] for p in PREDICTORS}
    return parts


def metrics_table(metrics: dict[str, Any]) -> str:
    """One markdown table: a row per (part, predictor)."""
    lines = [
        "| part | predictor | " + " | ".join(h for _, h in TABLE_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TABLE_COLUMNS),
    ]
    for part, by_pred in _parts(metrics).items():
        for name, m in by_pred.items():
            lines.append(f"| {part} | {name} | " + " | ".join(_cell(k, m) for k, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


def print_table(metrics: dict[str, Any]) -> None:
    """The same table on the console."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="model vs baselines")
    for header in ("part", "predictor", *(h for _, h in TABLE_COLUMNS)):
        table.add_column(header)
    for part, by_pred in _parts(metrics).items():
        for name, m in by_pred.items():
            table.add_row(part, name, *(_cell(k, m) for k, _ in TABLE_COLUMNS))
    console = Console(width=200)
    console.print(table)
    rates = _rates(metrics)
    if rates:
        equal = Table(title="failures caught at equal false-alarm rates",
                      caption="false alarms per 1,000 node-days; each threshold set on these rows")
        for header in ("part", "predictor", *(f"≤ {r}" for r in rates)):
            equal.add_column(header)
        for part, by_pred in _parts(metrics).items():
            for name, m in by_pred.items():
                equal.add_row(part, name, *_rate_cells(m, rates))
        console.print(equal)


def _rates(metrics: dict[str, Any]) -> list[str]:
    """The false-alarm rates of ``recall_at_false_alarm_rates``, in numeric order (JSON sorts
    "10" before "2")."""
    return sorted(metrics["model"].get("recall_at_false_alarm_rates", {}), key=float)


def _rate_cells(m: dict[str, Any], rates: list[str]) -> list[str]:
    at = m.get("recall_at_false_alarm_rates", {})
    return [f"{at[r]['recall']:.2f} ({at[r]['caught']}/{at[r]['failures']})"
            if at.get(r, {}).get("recall") is not None else "-" for r in rates]


def _cause_table(metrics: dict[str, Any]) -> str:
    causes = sorted(set().union(*(metrics[p].get("recall_by_cause", {}) for p in PREDICTORS)))
    lines = ["| cause | failures | " + " | ".join(PREDICTORS) + " |", "|---|---|" + "---|" * len(PREDICTORS)]
    for cause in causes:
        row = [metrics[p].get("recall_by_cause", {}).get(cause) for p in PREDICTORS]
        n = next((r["failures"] for r in row if r), 0)
        lines.append(
            f"| {cause} | {n} | " + " | ".join(f"{r['recall']:.2f}" if r else "-" for r in row) + " |"
        )
    return "\n".join(lines)


def _equal_rates_table(metrics: dict[str, Any]) -> str:
    """Failures caught by each predictor at equal false-alarm rates (thresholds set on these rows)."""
    rates = _rates(metrics)
    header = " | ".join(f"≤ {r} false alarms /1000 node-days" for r in rates)
    lines = [f"| part | predictor | {header} |", "|---|---|" + "---|" * len(rates)]
    for part, by_pred in _parts(metrics).items():
        for name, m in by_pred.items():
            lines.append(f"| {part} | {name} | " + " | ".join(_rate_cells(m, rates)) + " |")
    return "\n".join(lines)


def _budget_table(metrics: dict[str, Any]) -> str:
    """False alarms each predictor spent on every evaluated part or dataset, beside the budget."""
    lines = ["| part | node-days | " + " | ".join(PREDICTORS) + " |", "|---|---|" + "---|" * len(PREDICTORS)]
    for part, by_pred in _parts(metrics).items():
        cells = []
        for name in PREDICTORS:
            m = by_pred[name]
            spent = m.get("budget_spent")
            cells.append(f"{m['false_alarms']} ({m['false_alarms_per_1000_node_days']:.2f}"
                         + (f", {spent:.2f} × budget)" if spent is not None else ")"))
        lines.append(f"| {part} | {by_pred['model']['node_days']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _selection_text(metrics: dict[str, Any]) -> list[str]:
    """How the thresholds were set: training's out-of-fold choice with its folds, or the model's
    recorded source when evaluating."""
    info = metrics.get("_info", {})
    selection = info.get("threshold_selection")
    if selection is None:
        source = info.get("threshold_source") or {}
        if not source:
            return ["The model records no threshold source."]
        calibrated = source.get("kind") == "calibrate"
        where = "on a cluster's own telemetry by `foreshock calibrate`" if calibrated else "in training"
        return [f"The model's threshold was set {where}: "
                + ", ".join(f"`{k}` {v}" for k, v in sorted(source.items())) + "."]
    first = selection[PREDICTORS[0]]
    days = first["node_days"]
    text = [
        f"Each threshold is the lowest at and above which a {first['confidence'] * 100:g} % upper bound "
        f"on the rate of false-alarm episodes stays within the budget of "
        f"{first['budget_false_alarms_per_1000_node_days']:g} per 1,000 node-days, on {days:,.0f} "
        f"node-days scored out of fold ({len(selection['folds'])} time blocks: the validation period, "
        "scored by the model, and blocks of the training period, each scored by a model fitted "
        "without it).",
        "",
        "| predictor | threshold | false alarms out of fold | upper bound /1000 node-days | certified |",
        "|---|---|---|---|---|",
    ]
    for p in PREDICTORS:
        c = selection[p]
        bound = c["false_alarms_upper_bound_per_1000_node_days"]
        text.append(f"| {p} | {threshold_text(c['threshold'])} | {c['false_alarms']} | {bound:.2f} | "
                    f"{'yes' if c['certified'] else 'no'} |")
    text += ["", "| fold | scored by | node-days | failures | "
             + " | ".join(f"{p}: false alarms, caught" for p in PREDICTORS) + " |",
             "|---|---|---|---|" + "---|" * len(PREDICTORS)]
    for f in selection["folds"]:
        text.append(f"| {f['index']} | {f['scored_by']} | {f['node_days']:,.0f} | {f['failures']} | "
                    + " | ".join(f"{f[p]['false_alarms']}, {f[p]['caught']}" for p in PREDICTORS) + " |")
    return text


def _setting(key: str, value: Any) -> str:
    """A setting as the report's table shows it: each evaluated dataset by name, profile, size
    and seed."""
    if key != "datasets":
        return str(value)
    return "; ".join(f"{d['name']} ({d.get('profile')}, {d.get('nodes')} nodes, seed {d.get('seed')})"
                     for d in value)


def write_report(
    out_dir: Path, metrics: dict[str, Any], plots: list[Path], title: str, plotted_part: str
) -> Path:
    """``report.md``: setup, the table, recall per cause, thresholds and the plots."""
    info = metrics.get("_info", {})
    thresholds = ", ".join(f"{p} {threshold_text(metrics[p]['threshold'])}" for p in PREDICTORS)
    text = [
        f"# {title}",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {_setting(k, v)} |" for k, v in info.items() if k not in _LONG_SETTINGS),
        "",
        "## Model vs baselines",
        "",
        f"Score thresholds: {thresholds}. Recall is per failure; precision per alert episode "
        "(an episode ends after `alert_clear_ms` with no alerting row, or when the node's rows break).",
        "",
        metrics_table(metrics),
        "",
        "## False alarms against the budget",
        "",
        "False alarms (per 1,000 node-days, and that rate over the budget) on every evaluated part.",
        "",
        _budget_table(metrics),
        "",
        *_selection_text(metrics),
        "",
        f"False alarms that start within an hour after the node came back from repair ({plotted_part}): "
        + ", ".join(f"{p} {metrics[p].get('false_alarms_after_return', '-')} of {metrics[p]['false_alarms']}"
                    for p in PREDICTORS) + ".",
        "",
        "## Recall at equal false-alarm rates",
        "",
        "Each predictor's threshold set on these rows for each rate: not an operating point, but "
        "the like-for-like comparison where the validation thresholds spend different budgets.",
        "",
        _equal_rates_table(metrics),
        "",
        f"## Recall per failure cause ({plotted_part})",
        "",
        _cause_table(metrics),
        "",
        f"## Plots ({plotted_part})",
        "",
        *(f"![{p.stem}]({p.name})" for p in plots),
        "",
    ]
    path = Path(out_dir) / "report.md"
    path.write_text("\n".join(text))
    return path


def threshold_text(threshold: float) -> str:
    """Four decimals, more where the threshold is that close to 1: 0.9999996 is not 1 (logistic
    regression's certified thresholds crowd against it)."""
    gap = 1.0 - threshold
    digits = max(4, math.ceil(-math.log10(gap)) + 1) if gap > 0 else 4
    return f"{threshold:.{digits}f}".rstrip("0").rstrip(".")
