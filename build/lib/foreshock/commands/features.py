"""``foreshock features``: the feature table of a dataset folder, with pandas or on Dask."""

from __future__ import annotations

from pathlib import Path

import typer

from foreshock.commands.durations import option_ms

__all__ = ["register"]


def features(
    data: Path = typer.Option(
        ..., exists=True, file_okay=False, help="Dataset folder (foreshock simulate --out)."
    ),
    out: Path = typer.Option(..., help="Output parquet file (node, ts, then one column per feature)."),
    dask: str = typer.Option(
        None,
        help="Run on Dask: a scheduler address (tcp://host:8786) or 'local' "
        "for a LocalCluster on this machine.",
    ),
    workers: int = typer.Option(2, min=1, help="With --dask local: worker processes."),
    cadence: str = typer.Option("1m", help="One row per node every CADENCE (a multiple of 1m)."),
) -> None:
    """Compute the default feature set at a fixed cadence and write it as parquet."""
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.features.batch import compute_features, compute_features_dask

    cadence_ms = option_ms(cadence, "--cadence")
    try:
        if dask is None:
            table = compute_features(data, cadence_ms=cadence_ms, progress=True)
        elif dask == "local":
            from distributed import Client, LocalCluster

            with (
                LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
                ) as cluster,
                Client(cluster) as client,
            ):
                table = compute_features_dask(data, client, cadence_ms=cadence_ms, progress=True)
        else:
            table = compute_features_dask(data, dask, cadence_ms=cadence_ms, progress=True)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    table.attrs = {}
    table.to_parquet(out, index=False)
    typer.echo(
        f"{len(table)} rows x {len(DEFAULT_FEATURE_SET.names)} features "
        f"({table['node'].nunique()} nodes) -> {out}; feature set {DEFAULT_FEATURE_SET.hash[:12]}"
    )


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
    app.command("features")(features)
