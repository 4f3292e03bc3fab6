"""``foreshock simulate``: a cluster that fails, as a dataset folder or a Kafka stream."""

from __future__ import annotations

from pathlib import Path

import typer

from foreshock import shipped
from foreshock.commands.durations import Duration, duration_option
from foreshock.ingest.simulator import (
    DEFAULT_START_MS,
    ProfileError,
    Simulator,
    load_profile,
    stream,
    write_dataset,
)

__all__ = ["profile_path", "register"]


def profile_path(name_or_path: str) -> Path:
    """A shipped profile's name (``llama3``) or the path of a TOML file -> the file's path."""
    try:
        return shipped.profile(name_or_path)
    except LookupError as exc:
        raise ProfileError(str(exc)) from None


def simulate(
    profile: str = typer.Option(
        "llama3", help="Shipped profile name (llama3, infinitehbd, infinitehbd-refault) or a TOML path."
    ),
    nodes: int = typer.Option(128, min=1, help="Number of nodes."),
    days: float = typer.Option(7.0, min=0.0, help="Simulated days."),
    duration: Duration = duration_option(None, help="Simulated duration instead of --days (e.g. 6h, 90m)."),
    interval: Duration = duration_option("30s", help="Sampling interval (e.g. 10s, 30s, 1m)."),
    seed: int = typer.Option(0, help="Random seed: the same seed gives the same bytes."),
    rate_multiplier: float = typer.Option(
        None, min=0.0, help="Scale the failure rate (default: the profile's, normally 1.0)."
    ),
    start_ms: int = typer.Option(DEFAULT_START_MS, help="Start time, epoch ms UTC."),
    out: Path = typer.Option(None, help="Write a dataset folder here."),
    overwrite: bool = typer.Option(False, help="Replace a dataset already in --out."),
    kafka: str = typer.Option(None, help="Stream onto Kafka at this bootstrap address instead."),
    speed: float = typer.Option(
        60.0, min=0.0, help="With --kafka: simulated seconds per real second (0 = as fast as possible)."
    ),
) -> None:
    """Simulate N nodes x G GPUs failing with foreshocks and noise; write a dataset or stream it."""
    if (out is None) == (kafka is None):
        raise typer.BadParameter("give exactly one of --out DIR or --kafka BOOTSTRAP")
    try:
        prof = load_profile(profile_path(profile))
        duration_ms = duration.ms if duration is not None else round(days * 86_400_000)
        sim = Simulator(
            prof,
            nodes=nodes,
            duration_ms=duration_ms,
            interval_ms=interval.ms,
            seed=seed,
            start_ms=start_ms,
            rate_multiplier=rate_multiplier,
        )
    except (ProfileError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from foreshock.commands.progress import progress_bars

    label = f"{prof.name}: {nodes} nodes, GPU samples"
    with progress_bars() as progress:

        def advance(ts: int) -> None:
            progress(label, _done(sim, ts), sim.gpu_samples)

        if out is not None:
            write_dataset(sim, out, overwrite=overwrite, on_chunk=lambda c: advance(c.end_ms))
        else:
            from foreshock.commands.brokers import connect_kafka

            bus = connect_kafka(kafka, "simulate")
            try:
                stream(sim, bus, speed=speed or None, on_step=advance)
            finally:
                bus.close()
        progress(label, sim.gpu_samples, sim.gpu_samples)
    failures = len(sim.schedule.failures)
    where = out if out is not None else f"kafka {kafka}"
    typer.echo(
        f"{failures} failures injected ({sum(f.detectable for f in sim.schedule.failures)} detectable)"
        f" over {sim.gpu_days():,.0f} GPU-days -> {where}"
    )


def _done(sim: Simulator, ts: int) -> int:
    return min(sim.gpu_samples, (sim.step_of(ts) + 1) * sim.nodes * sim.gpus)


def register(app: typer.Typer) -> None:
    """Add ``foreshock simulate`` to ``app``."""
    app.command("simulate")(simulate)
