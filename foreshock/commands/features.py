"""``foreshock features``: a dataset's feature table (parquet by peer group and day), here or on Dask."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import typer

from foreshock.commands.durations import Duration, duration_option

__all__ = ["register"]


def features(
    data: Path = typer.Option(
        ..., exists=True, file_okay=False, help="Dataset folder (foreshock simulate --out)."
    ),
    out: Path = typer.Option(
        ...,
        help="Feature table folder to write: parquet partitions by node group and day, and table.json "
        "(feature-set hash, cadence, dataset fingerprint). train, evaluate and calibrate read it with "
        "--features.",
    ),
    dask: str = typer.Option(
        None,
        help="Run on Dask: a scheduler address (tcp://host:8786) or 'local' "
        "for a LocalCluster on this machine. Each worker writes its own partitions, so --out "
        "must be a folder every worker can write to.",
    ),
    workers: int = typer.Option(2, min=1, help="With --dask local: worker processes."),
    cadence: Duration = duration_option("1m", help="One row per node every CADENCE (a multiple of 1m)."),
    overwrite: bool = typer.Option(False, help="Replace a feature table already in --out."),
) -> None:
    """Compute the default feature set at a fixed cadence into a feature table folder."""
    from foreshock.commands.progress import progress_bars
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.features.table import FeatureTableError
    from foreshock.ingest.dataset import DatasetError
    from foreshock.models.frame import write_table

    cadence_ms = cadence.ms
    try:
        with ExitStack() as stack:
            client = dask
            if dask == "local":
                from distributed import Client, LocalCluster

                cluster = LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
                )
                stack.enter_context(cluster)
                client = stack.enter_context(Client(cluster))
            progress = stack.enter_context(progress_bars())
            table = write_table(data, out, cadence_ms=cadence_ms, client=client, progress=progress,
                                overwrite=overwrite)
    except (ValueError, DatasetError, FeatureTableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"{table.rows} rows x {len(DEFAULT_FEATURE_SET.names)} features in {len(table.partitions)} "
        f"partitions -> {out}; feature set {DEFAULT_FEATURE_SET.hash[:12]}, "
        f"dataset {table.identity.dataset_fingerprint}"
    )


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
    app.command("features")(features)
