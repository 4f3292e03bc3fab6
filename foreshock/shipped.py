"""Data that ships inside the package: cluster profiles, real fault traces, operating points.

Read through :mod:`importlib.resources`, so a wheel installed anywhere finds them exactly as a
checkout does (the files live in ``datasets/`` in the repository and install as the packages
``foreshock.profiles``, ``foreshock.traces`` and ``foreshock.operating_points``). Pip installs a
wheel as plain files, so each resource is handed out as a filesystem path.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["operating_point", "profile", "profile_names", "trace", "TRACE_FILES"]

TRACE_FILES = {
    "infinitehbd": "infinitehbd/fault_trace.json",
    "titan": "titan/gc_full.csv.gz",
    "titan-summary": "titan/gc_summary_loc.csv.gz",
    "titan-service": "titan/titan.service.txt",
}
"""Shipped real traces by name: the InfiniteHBD fault trace; Titan's GPU lives, the SC20 study's
per-GPU summary of them, and its service nodes (``datasets/traces/titan/README.md``)."""


def _resource(package: str, name: str) -> Path:
    return Path(str(resources.files(package).joinpath(name)))


def profile_names() -> list[str]:
    """Names of the shipped profiles (``infinitehbd``, ``llama3``)."""
    return sorted(p.name.removesuffix(".toml") for p in resources.files("foreshock.profiles").iterdir()
                  if p.name.endswith(".toml"))


def profile(name_or_path: str) -> Path:
    """A shipped profile's name (``llama3``) or the path of a TOML file -> the file's path.

    Raises ``LookupError`` naming the shipped profiles when the name is neither."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.is_file():
        return candidate
    if name_or_path not in profile_names():
        shipped = ", ".join(profile_names())
        raise LookupError(f"no profile named {name_or_path!r} (shipped: {shipped}; or give a .toml path)")
    return _resource("foreshock.profiles", f"{name_or_path}.toml")


def trace(name_or_path: str) -> Path:
    """A shipped trace's name (``infinitehbd``, ``titan``, ... in :data:`TRACE_FILES`) or a file's path."""
    if name_or_path in TRACE_FILES:
        return _resource("foreshock.traces", TRACE_FILES[name_or_path])
    return Path(name_or_path)


def operating_point(name_or_path: str) -> Path:
    """A JSON file's path, or the name of a measured operating point shipped with the package
    (``drill-256mb``: a drill's figures; ``llama3-512x14d-metrics``: a model's evaluation)."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    name = name_or_path.removesuffix(".json")
    folder = resources.files("foreshock.operating_points")
    names = sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
    if name not in names:
        raise LookupError(f"no file {name_or_path!r} and no shipped operating point of that name "
                          f"(shipped: {', '.join(names)})")
    return _resource("foreshock.operating_points", f"{name}.json")
