"""``foreshock demo``: simulate, train, replay a day through predictor and mitigator, report."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def demo(
    nodes: int = typer.Option(48, min=8, help="Nodes in the replayed cluster (8 GPUs each)."),
    days: float = typer.Option(
        3.0,
        min=2.0,
        help="Simulated days of the replayed cluster (the last is replayed); the history spans one fewer.",
    ),
    history_nodes: int = typer.Option(
        192, min=8, help="Nodes of the simulated history the model trains on (same profile, another seed)."
    ),
    out: Path = typer.Option(
        Path("runs/demo"), help="Folder for the data, the model, the audit log and the report."
    ),
    seed: int = typer.Option(7, help="Random seed of the simulation and the training."),
    rate_multiplier: float = typer.Option(
        150.0, min=1.0, help="Scale the profile's failure rate (a small cluster rarely fails within a day)."
    ),
    profile: str = typer.Option("llama3", help="Shipped profile name (llama3, infinitehbd) or a TOML path."),
    spares: int = typer.Option(4, min=1, help="Hot-spare nodes outside the training job."),
    budget: float | None = typer.Option(
        None,
        min=0.0,
        help="Alert budget: false alarms allowed per 1,000 node-days (sets the threshold). Default: the full "
        "evaluation's 1 at rate x 60, scaled with --rate-multiplier (transients scale with failures).",
    ),
    live: bool = typer.Option(True, "--live/--no-live", help="Show the live view (rich) during the replay."),
) -> None:
    """Watch the whole system work: a simulated cluster fails, the model sees it coming, the job moves."""
    from foreshock.commands.simulate import profile_path
    from foreshock.demo import DemoSettings, run_demo
    from foreshock.ingest.simulator import ProfileError

    try:
        settings = DemoSettings(
            out=out,
            profile=profile_path(profile),
            nodes=nodes,
            days=days,
            history_nodes=history_nodes,
            seed=seed,
            rate_multiplier=rate_multiplier,
            budget_per_1000_node_days=budget,
            spares=spares,
        )
    except (ProfileError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    run_demo(settings, live=live, say=typer.echo)


def register(app: typer.Typer) -> None:
    """Add ``foreshock demo`` to ``app``."""
    app.command("demo")(demo)
