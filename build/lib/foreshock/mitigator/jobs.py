"""Where the mitigator learns which job runs on which nodes: one-method sources.

:class:`FileJobs` reads the status each training hook publishes (``ROOT/<job>/job.json``, written
atomically by rank 0 after start and after every durable snapshot) — the same shared folder the
file command channel uses. :class:`StaticJobs` is a fixed list.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from foreshock.mitigator.channels import write_json_atomic
from foreshock.mitigator.plan import JobView

__all__ = ["JobSource", "StaticJobs", "FileJobs", "write_job_status"]


class JobSource(Protocol):
    def jobs(self) -> Sequence[JobView]: ...


class StaticJobs:
    """A fixed list of jobs (tests, and deployments that configure jobs by hand)."""

    def __init__(self, jobs: Iterable[JobView] = ()):
        self._jobs = tuple(jobs)

    def jobs(self) -> Sequence[JobView]:
        return self._jobs


def write_job_status(root: str | Path, view: JobView) -> None:
    """Publish a job's status where :class:`FileJobs` reads it."""
    write_json_atomic(Path(root) / view.job / "job.json", asdict(view))


class FileJobs:
    """Jobs as published by their hooks under ``root``, re-read at most every ``max_age_s``."""

    def __init__(self, root: str | Path, max_age_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.max_age_s = max_age_s
        self.clock = clock
        self._cache: tuple[float, Sequence[JobView]] | None = None

    def jobs(self) -> Sequence[JobView]:
        now = self.clock()
        if self._cache is None or now - self._cache[0] >= self.max_age_s:
            self._cache = (now, self._read())
        return self._cache[1]

    def _read(self) -> Sequence[JobView]:
        out = []
        for path in sorted(self.root.glob("*/job.json")):
            raw = json.loads(path.read_text())
            raw["nodes"] = tuple(raw["nodes"])
            out.append(JobView(**raw))
        return tuple(out)
