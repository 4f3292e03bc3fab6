"""The cluster simulator: telemetry of N nodes x G GPUs that fail, with foreshocks and noise.

``load_profile`` reads a failure profile (TOML), :class:`Simulator` draws the failures and
generates telemetry chunk by chunk, :func:`write_dataset` writes it in the dataset layout
(``foreshock.ingest.dataset``) and :func:`stream` publishes it onto a bus in accelerated or real time.
"""

from foreshock.ingest.simulator.engine import DEFAULT_CHUNK_ROWS, DEFAULT_START_MS, Chunk, Simulator
from foreshock.ingest.simulator.output import stream, write_dataset
from foreshock.ingest.simulator.profile import PRECURSORS, Profile, ProfileError, load_profile, parse_profile
from foreshock.ingest.simulator.schedule import Episode, Failure, Schedule

__all__ = [
    "Simulator",
    "Chunk",
    "DEFAULT_START_MS",
    "DEFAULT_CHUNK_ROWS",
    "write_dataset",
    "stream",
    "Profile",
    "ProfileError",
    "PRECURSORS",
    "load_profile",
    "parse_profile",
    "Episode",
    "Failure",
    "Schedule",
]
