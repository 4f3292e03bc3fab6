"""``foreshock train`` and ``foreshock evaluate``: the risk model and its baselines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from foreshock.commands.durations import Duration, duration_option

_TRACKING_HELP = "MLflow tracking URI (default: sqlite:///<data dir>/mlflow.db)"
FEATURES_HELP = (
    "feature table folder (foreshock features --out) computed from --data; default: the dataset's "
    "feature cache (<data dir>/feature-cache/), computed on first use"
)


@contextmanager
def _input_errors() -> Iterator[None]:
    """A folder that is no dataset, and a feature table that does not match or is not one, are
    usage errors (exit 2) that say why."""
    from foreshock.features.table import FeatureTableError
    from foreshock.ingest.dataset import DatasetError

    try:
        yield
    except (DatasetError, FeatureTableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def train(
    data: Path = typer.Option(..., "--data", exists=True, file_okay=False, help="dataset folder"),
    out: Path = typer.Option(..., "--out", help="folder for model/, report.md, metrics.json, plots"),
    horizon: Duration = duration_option("60m", "--horizon", unit="m",
                                        help="predict failures within this horizon (whole minutes)"),
    tracking_uri: str = typer.Option(
        None, "--tracking-uri", envvar="FORESHOCK_TRACKING_URI", help=_TRACKING_HELP
    ),
    dask: str = typer.Option(
        None,
        "--dask",
        help="Dask scheduler address: features (when not cached) and lightgbm.dask training run there, "
        "the workers reading the feature table themselves (it must be on a filesystem they share)",
    ),
    cadence: Duration = duration_option("60s", "--cadence", help="feature row cadence"),
    budget: float = typer.Option(1.0, "--budget", help="false alarms allowed per 1,000 node-days"),
    censor: Duration = duration_option(
        "6h", "--censor", help="training leaves out negatives this close before a failure (0 keeps all)"
    ),
    alert_clear: Duration = duration_option(
        "30m", "--alert-clear", help="an alert episode ends after this long with no alerting score"
    ),
    prior_weight: float = typer.Option(
        0.3,
        "--prior-weight",
        min=0.0,
        help="boost the trees from this times logistic regression's log-odds, if that beats trees "
        "alone on validation (0: trees alone)",
    ),
    folds: int = typer.Option(
        4,
        "--folds",
        min=1,
        help="time blocks the threshold is chosen on: validation plus FOLDS - 1 blocks of the training "
        "period, each scored by a model that never saw it (1: validation only)",
    ),
    budget_confidence: float = typer.Option(
        0.9,
        "--budget-confidence",
        min=0.5,
        max=0.999,
        help="the threshold keeps this one-sided upper confidence bound on false alarms in budget",
    ),
    no_register: bool = typer.Option(False, "--no-register", help="skip MLflow logging and registration"),
    seed: int = typer.Option(0, "--seed", help="seed of subsampling and LightGBM: same seed, same model"),
    features: Path = typer.Option(
        None, "--features", exists=True, file_okay=False, help=FEATURES_HELP
    ),
    negative_rate: float = typer.Option(
        1.0,
        "--negative-rate",
        min=0.0,
        max=1.0,
        help="the trees see this share of the negatives far from any failure (a day or more from a "
        "failure or a repair), each weighted by its inverse; the rest of the rows are all kept (1: all)",
    ),
) -> None:
    """Train the LightGBM risk model and its baselines; print model vs baselines."""
    from foreshock.commands.progress import progress_bars
    from foreshock.models.report import print_table
    from foreshock.models.train import train_from_dataset

    if negative_rate <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--negative-rate")
    if horizon.ms < 60_000 or horizon.ms % 60_000:
        raise typer.BadParameter(f"{horizon} is not a whole number of minutes", param_hint="--horizon")
    with _input_errors(), progress_bars() as progress:
        model = train_from_dataset(
            data,
            out,
            horizon_minutes=int(horizon.minutes),
            tracking_uri=tracking_uri,  # None: the data folder's store, MLflow loaded only to register
            dask_address=dask,
            register=not no_register,
            cadence_ms=cadence.ms,
            budget_per_1000_node_days=budget,
            censor_ms=censor.ms,
            clear_ms=alert_clear.ms,
            prior_weight=prior_weight,
            folds=folds,
            budget_confidence=budget_confidence,
            seed=seed,
            table=features,
            negative_rate=negative_rate,
            progress=progress,
        )
    print_table(json.loads((out / "metrics.json").read_text()))
    where = f"registered as foreshock-risk version {model.version}" if model.version else "not registered"
    typer.echo(f"model written to {out / 'model'} ({where}); report: {out / 'report.md'}")
    warning = uncertified_warning(model.threshold_source)
    if warning:
        typer.echo(warning, err=True)


def uncertified_warning(source: dict) -> str | None:
    """What an operator must hear when the rows out of fold were too few to bound the threshold's
    false alarms within the budget (``source``: the model's ``threshold_source``); None when they
    did. The report says it too, but a threshold that may spend twice its budget should not pass
    unnoticed at the console."""
    from foreshock.models.alerting import poisson_upper_bound

    if source.get("certified", True):
        return None
    confidence, budget = source["confidence"], source["budget_false_alarms_per_1000_node_days"]
    needed = poisson_upper_bound(0, confidence) * 1000 / budget
    return (
        f"warning: the alert threshold is not certified: {source['node_days']:,.0f} node-days out of "
        f"fold bound its false alarms at {source['false_alarms_upper_bound_per_1000_node_days']:.2f} per "
        f"1,000 node-days ({confidence * 100:g} %), above the budget of {budget:g}; certifying it takes "
        f"about {needed:,.0f} with no alarm (a longer history, or `foreshock calibrate` on more days)"
    )


def evaluate(
    model: str = typer.Option(
        ..., "--model", help="models:/ URI or a folder that `foreshock train` wrote"
    ),
    data: list[Path] = typer.Option(
        ...,
        "--data",
        exists=True,
        file_okay=False,
        help="dataset folder to judge on; repeat it to judge several datasets as one pool",
    ),
    out: Path = typer.Option(..., "--out", help="folder for report.md, metrics.json, plots"),
    tracking_uri: str = typer.Option(
        None, "--tracking-uri", envvar="FORESHOCK_TRACKING_URI", help=_TRACKING_HELP
    ),
    dask: str = typer.Option(
        None, "--dask", help="Dask scheduler address: compute features there (when not cached)"
    ),
    cadence: Duration | None = duration_option(
        None, "--cadence", help="feature row cadence (default: the one the model was trained at)"
    ),
    features: list[Path] = typer.Option(
        None, "--features", exists=True, file_okay=False,
        help=FEATURES_HELP + "; repeat it, once per --data and in the same order",
    ),
) -> None:
    """Evaluate a trained model and its baselines on another dataset (or a pool of them)."""
    from foreshock.commands.progress import progress_bars
    from foreshock.models.artifact import RiskModel
    from foreshock.models.evaluate import evaluate as run_evaluation
    from foreshock.models.registry import sqlite_uri
    from foreshock.models.report import print_table

    risk_model = RiskModel.load(model, tracking_uri=tracking_uri or sqlite_uri(data[0]))
    cadence_ms = cadence.ms if cadence else None
    with _input_errors(), progress_bars() as progress:
        metrics = run_evaluation(
            risk_model, data, out, dask_address=dask, cadence_ms=cadence_ms, tables=features or None,
            progress=progress,
        )
    print_table(metrics)
    typer.echo(f"report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``evaluate`` to ``app``."""
    app.command("train")(train)
    app.command("evaluate")(evaluate)
