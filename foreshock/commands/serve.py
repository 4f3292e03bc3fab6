"""``foreshock serve``: the online risk service: the scoring loop, and the HTTP API in a process of its own.

This module is the composition root of the predictor: it reads the environment
(``FORESHOCK_API_TOKEN``, ``FORESHOCK_API_TOKEN_FILE``, ``MLFLOW_TRACKING_URI``), builds the bus,
the feature engines, the model source and the checkpoint store, and passes them in.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import threading
from pathlib import Path

import typer

from foreshock.commands.durations import Duration, duration_option
from foreshock.commands.sizes import option_bytes


def read_token(token_file: Path | None) -> str | None:
    """The API token: ``FORESHOCK_API_TOKEN``, else the first line of the token file (flag or
    ``FORESHOCK_API_TOKEN_FILE``); None disables the write endpoints."""
    token = os.environ.get("FORESHOCK_API_TOKEN")
    if token:
        return token.strip()
    path = token_file or (Path(os.environ["FORESHOCK_API_TOKEN_FILE"])
                          if os.environ.get("FORESHOCK_API_TOKEN_FILE") else None)
    if path is None:
        return None
    text = path.read_text().strip()
    if not text:
        raise typer.BadParameter(f"token file {path} is empty")
    return text.splitlines()[0].strip()


def no_huge_page_advice() -> None:
    """Stop numpy advising huge pages (``madvise(MADV_HUGEPAGE)``) for the arrays it allocates from
    here on, unless the operator set numpy's own ``NUMPY_MADVISE_HUGEPAGE``.

    Where the kernel compacts memory on demand for advised regions (``defrag`` = ``madvise``, a
    common default), a first touch of such an array waits for compaction, and the engines' rings
    are such arrays: they are allocated as nodes appear and when a checkpoint is restored, on the
    scoring loop, and the wait is several times the cost of the ordinary page faults it replaces.
    With ``enabled`` = ``always`` the kernel still gathers the pages into huge ones in the
    background (khugepaged), off the loop.
    """
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.26
        from numpy.core.multiarray import _set_madvise_hugepage
    _set_madvise_hugepage(False)


def serve(
    model: str = typer.Option(..., "--model",
                              help="models:/foreshock-risk@champion, models:/name/N or a model folder"),
    kafka: str | None = typer.Option(None, "--kafka",
                                     help="Kafka bootstrap host:port; omitted: the in-memory bus"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI (for models:/ URIs)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address the risk API listens on"),
    port: int = typer.Option(8080, "--port", help="port of the risk API"),
    score_every: Duration = duration_option("10s", "--score-every", help="scoring period, in event time"),
    lateness: Duration = duration_option("0s", "--lateness",
                                         help="how far a record may trail its log and still count"),
    tolerance: Duration = duration_option(
        "60s", "--tolerance", help="out-of-order allowance of the feature engine; a record further behind "
        "its log than --lateness + --tolerance is dead-lettered"),
    future_tolerance: Duration = duration_option(
        "5m", "--future-tolerance",
        help="a record dated more than this after its receipt (its log time, capped by the clock) is "
        "dead-lettered"),
    max_lag: int = typer.Option(10_000, "--max-lag", min=0,
                                help="messages behind the topics beyond which /readyz answers 503"),
    max_body: str = typer.Option("1MiB", "--max-body",
                                 help="largest HTTP request body; a larger one is refused with 413 unread"),
    group: str = typer.Option("foreshock-predictor", "--group", help="Kafka consumer group"),
    checkpoint_dir: Path | None = typer.Option(
        None, "--checkpoint-dir", help="shared by the group's processes; default with --kafka: "
        "$FORESHOCK_CACHE/predictor/<group>; without --kafka: none (state in memory)"),
    checkpoint_every: Duration = duration_option(
        "30s", "--checkpoint-every",
        help="wall time between two checkpoints of a partition (partitions take turns, spread over it)"),
    reload_every: Duration = duration_option("30s", "--reload-every",
                                             help="how often to check the model alias"),
    token_file: Path | None = typer.Option(None, "--token-file", help="file holding the API bearer token"),
    mitigator_url: str | None = typer.Option(
        None, "--mitigator-url", help="the mitigator's /status address as operators' browsers reach it "
        "(http://host:9403): the status page at / then shows its last actions"),
    max_poll_records: int = typer.Option(5000, "--max-poll-records", min=1,
                                         help="messages taken per poll (smaller: smoother catch-up)"),
    simulate_nodes: int = typer.Option(32, "--simulate-nodes", min=1,
                                       help="without --kafka: nodes of the simulated cluster fed to the bus"),
    speed: float = typer.Option(60.0, "--speed", min=0.0,
                                help="without --kafka: simulated seconds per real second (0: flat out)"),
    scoring_nice: int = typer.Option(
        10, "--scoring-nice", min=0, max=19,
        help="niceness the scoring loop takes once the API process is up (0: none): on a shared core "
        "the kernel then answers API requests first and scoring catches up between them"),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
) -> None:
    """Consume telemetry, score every node each period, publish risk.scores, serve the risk API."""
    from foreshock.commands.brokers import connect_kafka
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.ingest.bus import InMemoryBus
    from foreshock.ingest.kafka_local import cache_dir
    from foreshock.predictor.checkpoint import CheckpointStore
    from foreshock.predictor.engines import OnlineEngines
    from foreshock.predictor.front import ApiProcess
    from foreshock.predictor.model_source import ModelMismatchError, model_source
    from foreshock.predictor.service import RiskService, ServiceConfig

    # `kill -USR1 PID` writes every thread's stack to stderr: what a stuck loop is waiting on
    # (the consumer, the broker, a lock) can be read from a live process without restarting it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kafka", "mlflow", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    token = read_token(token_file)
    if mitigator_url:
        from foreshock.predictor.api import status_page

        try:
            status_page(mitigator_url)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--mitigator-url") from None
    if kafka:
        bus = connect_kafka(kafka, "serve", client_id=f"foreshock-predictor-{os.getpid()}")
        checkpoint_dir = checkpoint_dir or cache_dir() / "predictor" / group
    else:
        bus = InMemoryBus()
        _feed_simulation(bus, simulate_nodes, speed)
    no_huge_page_advice()
    engines = OnlineEngines(DEFAULT_FEATURE_SET, tolerance_ms=tolerance.ms)
    try:
        config = ServiceConfig(group=group, score_every_ms=score_every.ms, lateness_ms=lateness.ms,
                               checkpoint_every_ms=checkpoint_every.ms, reload_every_ms=reload_every.ms,
                               max_records=max_poll_records, max_lag=max_lag,
                               future_tolerance_ms=future_tolerance.ms)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    max_body_bytes = option_bytes(max_body, "--max-body")
    store = CheckpointStore(checkpoint_dir, engines.load) if checkpoint_dir else None
    try:
        service = RiskService(bus, engines, model_source(model, tracking_uri), config=config,
                              checkpoints=store).start()
    except (ModelMismatchError, FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    # Full collections walk every tracked object while holding the interpreter lock; start-up
    # leaves hundreds of thousands (imported libraries, the model) that never die. Freezing them
    # keeps each full collection to what the loop allocates. A poll allocates a tuple or more per
    # record (about 40,000 a poll), nearly all freed at once: a young generation of 700 objects
    # would be collected dozens of times a poll for nothing.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    stop = threading.Event()
    front = ApiProcess(service, host=host, port=port, history=config.history, token=token,
                       max_body_bytes=max_body_bytes, mitigator_url=mitigator_url,
                       log_level=log_level.upper()).start()
    # After the API process is started, so it keeps the default priority: its requests are short
    # and latency-bound, the loop's polls long and throughput-bound. Threads started from here on
    # (the loop) inherit the niceness; those already running (the Kafka client's) keep theirs.
    os.nice(scoring_nice)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    def run_loop() -> None:
        try:
            service.run(stop)
        finally:
            stop.set()  # a dead loop takes the process down; the supervisor restarts it

    def watch_api() -> None:  # a dead API process stops this one too; the supervisor restarts both
        front.process.join()
        stop.set()

    loop = threading.Thread(target=run_loop, name="risk-service", daemon=True)
    loop.start()
    threading.Thread(target=watch_api, name="api-watch", daemon=True).start()
    typer.echo(f"risk API on http://{host}:{port} (docs at /docs); "
               f"{'Kafka ' + kafka if kafka else 'in-memory bus'}; model {service.model.version or model}")
    while not stop.wait(1.0):  # the signal handlers run on this thread
        pass
    loop.join(timeout=60)  # the last checkpoint; bounded, as a broker that is gone never answers a flush
    front.stop()
    bus.close()
    if service.error is not None:
        typer.echo(f"error: the service loop stopped: {service.error!r}", err=True)
        raise typer.Exit(1)
    if front.process.exitcode not in (0, None, -signal.SIGTERM):
        typer.echo(f"error: the API process exited with code {front.process.exitcode}", err=True)
        raise typer.Exit(1)


def _feed_simulation(bus, nodes: int, speed: float) -> None:
    """The embedded demo's telemetry: a day of the llama3 profile streamed onto ``bus`` in a thread."""
    from foreshock.commands.simulate import profile_path
    from foreshock.ingest.simulator import Simulator, load_profile, stream

    sim = Simulator(load_profile(profile_path("llama3")), nodes=nodes, duration_ms=86_400_000,
                    interval_ms=30_000, seed=0)
    threading.Thread(target=stream, args=(sim, bus), kwargs={"speed": speed or None},
                     name="simulated-telemetry", daemon=True).start()


def register(app: typer.Typer) -> None:
    """Add ``foreshock serve``."""
    app.command("serve")(serve)
