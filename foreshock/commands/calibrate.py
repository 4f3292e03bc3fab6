"""``foreshock calibrate``: set a trained model's alert threshold on a new cluster's telemetry."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from foreshock.commands.train import FEATURES_HELP

__all__ = ["register"]


def calibrate(
    model: str = typer.Option(
        ..., "--model", help="models:/ URI (models:/foreshock-risk@champion) or a `foreshock train` folder"
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        exists=True,
        file_okay=False,
        help="dataset folder of the new cluster's recent telemetry (with its node events when it has them)",
    ),
    budget: float = typer.Option(..., "--budget", min=0.0, help="false alarms allowed per 1,000 node-days"),
    confidence: float = typer.Option(
        0.9,
        "--budget-confidence",
        min=0.5,
        max=0.999,
        help="the threshold keeps this one-sided upper confidence bound on false alarms in budget",
    ),
    unlabelled: bool = typer.Option(
        False,
        "--unlabelled",
        help="count every alert episode as a false alarm, even where the data record failures",
    ),
    tracking_uri: str = typer.Option(
        None,
        "--tracking-uri",
        envvar="FORESHOCK_TRACKING_URI",
        help="MLflow tracking URI (default: sqlite:///<data dir>/mlflow.db)",
    ),
    alias: str = typer.Option(
        None, "--alias", help="move this registry alias (champion, or a cluster's own) to the new version"
    ),
    no_register: bool = typer.Option(False, "--no-register", help="skip MLflow registration"),
    out: Path = typer.Option(
        None, "--out", help="also write the calibrated model (OUT/model) and OUT/calibration.json"
    ),
    dask: str = typer.Option(None, "--dask", help="Dask scheduler address: compute features there"),
    features: Path = typer.Option(None, "--features", exists=True, file_okay=False, help=FEATURES_HELP),
) -> None:
    """Set the model's alert threshold for a false-alarm budget on a new cluster's telemetry, without
    retraining, and register it as a new model version that records where its threshold came from."""
    from foreshock.commands.progress import progress_bars
    from foreshock.ingest.dataset import DatasetError
    from foreshock.models.artifact import RiskModel
    from foreshock.models.calibrate import calibrate as run_calibration
    from foreshock.models.frame import open_labelled
    from foreshock.models.registry import register_calibrated, sqlite_uri

    if alias and no_register:
        raise typer.BadParameter("--alias moves a registry alias: it needs registration (drop --no-register)")
    tracking_uri = tracking_uri or sqlite_uri(data)
    try:
        trained = RiskModel.load(model, tracking_uri=tracking_uri)
        cadence_ms = int(trained.metrics.get("training", {}).get("cadence_ms", 60_000))
        with progress_bars() as progress:
            labelled = open_labelled(data, trained.horizon_minutes * 60_000, cadence_ms, table=features,
                                     dask_address=dask, progress=progress)
            result = run_calibration(
                trained, labelled, budget, confidence=confidence, use_labels=not unlabelled,
                dataset=str(data.resolve()), progress=progress,
            )
    except (DatasetError, FileNotFoundError, ValueError) as exc:  # a feature table's errors among them
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for line in _summary(result, data):
        typer.echo(line)
    if out is not None:
        result.model.save(out / "model")
        choices = {p: c.to_json() for p, c in result.choices.items()}
        record = {"source": result.source, "choices": choices, "thresholds": result.thresholds}
        (out / "calibration.json").write_text(json.dumps(record, indent=1))
        typer.echo(f"calibrated model written to {out / 'model'}; record: {out / 'calibration.json'}")
    if no_register:
        return
    version = register_calibrated(result.model, tracking_uri=tracking_uri, alias=alias)
    moved = (f"; alias {alias} now points to it" if alias else
             "; move an alias to it (--alias, or MLflow) for a service to serve it")
    typer.echo(f"registered foreshock-risk version {version} (calibrated from version "
               f"{result.source['from_version'] or '-'}){moved}")


def _summary(result, data: Path) -> list[str]:
    from foreshock.models.report import threshold_text

    s = result.source
    kind = (f"labelled: alerts before the {s['failures_excluded']} failures are not counted" if s["labelled"]
            else "unlabelled: every alert episode counted as a false alarm (an upper bound)")
    lines = [f"calibrated on {data} ({s['node_days']:,.0f} node-days, {kind})"]
    for name, c in result.choices.items():
        verdict = "within budget" if c.certified else "not certified: too few node-days; no alarm allowed"
        if result.thresholds[name] != c.threshold:
            verdict += f"; below the trained {threshold_text(result.thresholds[name])}, which stays"
        lines.append(
            f"  {name}: threshold {threshold_text(c.threshold)}, {c.false_alarms} false alarms, "
            f"{c.confidence * 100:g} % bound {c.upper_per_1000_node_days:.2f} per 1,000 node-days against "
            f"a budget of {c.budget_per_1000_node_days:g} ({verdict})"
        )
    before, after = threshold_text(s["previous_threshold"]), threshold_text(s["threshold"])
    lines.append(f"model threshold {before} -> {after}")
    if result.alerting_rows == 0:
        lines.append("the model now alerts on none of these rows: their top score is an alarm the budget "
                     "cannot afford (record the failures in the node events, or use a longer history)")
    return lines


def register(app: typer.Typer) -> None:
    """Add ``foreshock calibrate`` to ``app``."""
    app.command("calibrate")(calibrate)
