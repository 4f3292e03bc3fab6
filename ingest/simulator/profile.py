"""Failure profiles: what fails, how often, with which foreshocks, read from TOML.

A profile is data, validated once: an unknown key, a missing required key, a value of the
wrong type or range, or shares that do not add up to 1 raise :class:`ProfileError` naming the
key (``failure[2].share``), so a typo never silently falls back to a default.

Keys (``*`` = required; every other key has the default shown)::

    description = ""                     # free text
    [cluster]
    * gpus_per_node = 8
    * interruptions_per_gpu_day = 0.000474   # failures per GPU-day of up time
      rate_multiplier = 1.0              # scales the failure rate (small clusters, training data)
      ib_ports_per_node = gpus_per_node  # InfiniBand ports per node (one HCA per GPU)
      gpu_model = "NVIDIA H100 80GB HBM3"
      repair_median_hours = 4.0          # lognormal repair time, for failures that do not set one
      repair_sigma = 1.0                 # sigma of log(repair hours)
    [[failure]]                          # one table per failure class
    * cause = "gpu_hbm"
    * share = 0.172                      # of all interruptions; shares sum to 1 (+-0.001)
    * xid = [48, 94, 95, 63, 64]         # emitted at the failure instant (may be empty)
    * precursor = "ecc"                  # ecc | thermal | nvlink | ib_link | power | pcie | none
    * lead_minutes = [30, 360]           # foreshocks start uniform(lo, hi) minutes before
    * detectable = 0.8                   # fraction showing foreshocks; must be 0 for "none"
      scope = "gpu"                      # gpu: one GPU (or port) is hit; node: all of them
      repair_median_hours, repair_sigma  # override the cluster's repair distribution
    [noise]
    * benign_xid_per_gpu_day = 0.01      # application Xids on healthy GPUs
      benign_xids = [13, 31, 43]
      false_alarms_per_failure = 1.0     # weak transient foreshocks on healthy nodes, per failure
      false_alarm_strength = [0.15, 0.6] # their intensity relative to a real foreshock
      sensor_noise = 1.0                 # scales every gauge's noise
      diurnal_amplitude = 0.05           # relative swing of GPU load over a day
      noisy_gpu_fraction = 0.03          # healthy GPUs with a high background of corrected errors
      missing_scrape_fraction = 0.0      # node scrapes lost (no GPU or link rows for that instant)
    [refault]                            # optional: repeat failures; without it a repair is perfect
    * failed_repair_probability = 0.2    # a repair that does not fix the node: same cause again soon
    * failed_repair_median_hours = 1.5   # lognormal delay from the return to that refault
    * failed_repair_sigma = 1.5          # sigma of log(delay hours)
    * lemon_fraction = 0.05              # nodes that fail lemon_rate_multiplier times as often
    * lemon_rate_multiplier = 10.0       # (>= 1)

``interruptions_per_gpu_day`` stays the rate of all interruptions: with a ``[refault]`` table
the simulator lowers a healthy node's own failure rate so that, refaults and lemons included
(and lemons' longer time in repair), the cluster fails as often per day up as the profile says.

``extends = "name"`` (top level) starts from the profile ``name.toml`` in the same folder: each
table this file gives replaces that profile's table of the same name (``[[failure]]`` as a
whole), so a variant adds a ``[refault]`` table without copying the failure classes.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy.special import ndtr

__all__ = [
    "PRECURSORS",
    "ProfileError",
    "FailureClass",
    "Cluster",
    "Noise",
    "Refault",
    "Profile",
    "parse_profile",
    "read_profile_data",
    "load_profile",
]

PRECURSORS: Final = ("ecc", "thermal", "nvlink", "ib_link", "power", "pcie", "none")
_REQUIRED: Final = object()


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the offending key."""


@dataclass(frozen=True, slots=True)
class FailureClass:
    """One cause of interruption and the way it shows itself."""

    cause: str
    share: float
    xid: tuple[int, ...]
    precursor: str
    lead_minutes: tuple[float, float]
    detectable: float
    scope: str
    repair_median_hours: float
    repair_sigma: float


@dataclass(frozen=True, slots=True)
class Cluster:
    gpus_per_node: int
    interruptions_per_gpu_day: float
    rate_multiplier: float
    ib_ports_per_node: int
    gpu_model: str
    repair_median_hours: float
    repair_sigma: float


@dataclass(frozen=True, slots=True)
class Noise:
    benign_xid_per_gpu_day: float
    benign_xids: tuple[int, ...]
    false_alarms_per_failure: float
    false_alarm_strength: tuple[float, float]
    sensor_noise: float
    diurnal_amplitude: float
    noisy_gpu_fraction: float
    missing_scrape_fraction: float


@dataclass(frozen=True, slots=True)
class Refault:
    """Repeat failures: repairs that do not fix the node, and nodes that keep failing."""

    failed_repair_probability: float
    failed_repair_median_hours: float
    failed_repair_sigma: float
    lemon_fraction: float
    lemon_rate_multiplier: float

    def mean_delay_days(self) -> float:
        """Mean time from a failed repair's return to its refault (a lognormal's mean)."""
        return self.failed_repair_median_hours * math.exp(self.failed_repair_sigma**2 / 2) / 24.0

    def _cycle(self, rate: float, down_days: float) -> tuple[float, float]:
        """Mean (up, up + down) days per failure of a node whose own failures come at ``rate``
        per day up: after each repair, a refault with probability p, else its own next failure."""
        p = self.failed_repair_probability
        up = p * self.mean_delay_days() + (1.0 - p) / rate
        return up, up + down_days

    def fleet_rate(self, first_rate: float, down_days: float) -> float:
        """Failures per node-day up, refaults and lemons included, when a healthy node's own
        failures come at ``first_rate`` per day up and each takes ``down_days`` to repair."""
        f, m = self.lemon_fraction, self.lemon_rate_multiplier
        up_n, cycle_n = self._cycle(first_rate, down_days)
        up_l, cycle_l = self._cycle(m * first_rate, down_days)
        failures = (1.0 - f) / cycle_n + f / cycle_l
        return failures / ((1.0 - f) * up_n / cycle_n + f * up_l / cycle_l)

    def first_failure_rate(self, failures_per_day: float, down_days: float) -> float:
        """The healthy node's own failure rate (per day up) that makes the fleet fail at
        ``failures_per_day`` per node-day up (bisection; :meth:`fleet_rate` grows with it)."""
        lo, hi = failures_per_day * 1e-6, failures_per_day * 10.0
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if self.fleet_rate(mid, down_days) < failures_per_day else (lo, mid)
        return math.sqrt(lo * hi)

    def lemon_repair_share(self, first_rate: float, down_days: float) -> float:
        """Share of all repairs that are a lemon's (lemons fail more, and so are down more)."""
        f, m = self.lemon_fraction, self.lemon_rate_multiplier
        lemon = f / self._cycle(m * first_rate, down_days)[1]
        return lemon / (lemon + (1.0 - f) / self._cycle(first_rate, down_days)[1])


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    cluster: Cluster
    failures: tuple[FailureClass, ...]
    noise: Noise
    refault: Refault | None = None

    def mean_repair_days(self, horizon_days: float) -> float:
        """Mean down time per failure seen in a run of ``horizon_days``: the failure classes'
        lognormal repair times, by share, each cut at the end of the run from a failure time
        uniform over it (the lognormals' own means are dominated by repairs no run sees)."""
        remaining = (np.arange(_HORIZON_POINTS) + 0.5) / _HORIZON_POINTS * horizon_days * 24.0
        hours = sum(f.share * _lognormal_mean_below(f.repair_median_hours, f.repair_sigma, remaining).mean()
                    for f in self.failures)
        return float(hours) / 24.0

    def node_failures_per_day(self, rate_multiplier: float | None = None) -> float:
        """Failure rate of one up node: GPUs per node x rate per GPU-day x multiplier."""
        mult = self.cluster.rate_multiplier if rate_multiplier is None else rate_multiplier
        return self.cluster.gpus_per_node * self.cluster.interruptions_per_gpu_day * mult


_HORIZON_POINTS: Final = 256


def _lognormal_mean_below(median: float, sigma: float, cap: np.ndarray) -> np.ndarray:
    """E[min(X, cap)] for X lognormal(log median, sigma), at each cap."""
    if sigma == 0:
        return np.minimum(median, cap)
    mu, log_cap = math.log(median), np.log(cap)
    return (math.exp(mu + sigma**2 / 2) * ndtr((log_cap - mu - sigma**2) / sigma)
            + cap * (1.0 - ndtr((log_cap - mu) / sigma)))


def _check(key: str, value: Any, kind: str) -> Any:
    """Validate one value against a kind: int+, float+, float0, prob, str, ints, range, range01."""

    def bad(why: str) -> ProfileError:
        return ProfileError(f"{key}: {why} (got {value!r})")

    is_num = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        if not isinstance(value, str) or (key.endswith("cause") and not value):
            raise bad("expected a non-empty string")
        return value
    if kind == "int+":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad("expected an integer >= 1")
        return value
    if kind in ("float+", "float0", "prob"):
        if not is_num:
            raise bad("expected a number")
        value = float(value)
        if kind == "float+" and value <= 0:
            raise bad("expected a number > 0")
        if kind == "float0" and value < 0:
            raise bad("expected a number >= 0")
        if kind == "prob" and not 0 <= value <= 1:
            raise bad("expected a number in [0, 1]")
        return value
    if kind == "ints":
        if not isinstance(value, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
        ):
            raise bad("expected a list of non-negative integers")
        return tuple(value)
    if kind in ("range", "range01"):
        ok = (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        )
        if not ok or not 0 <= value[0] <= value[1] or (kind == "range01" and value[1] > 1):
            raise bad("expected [lo, hi] with 0 <= lo <= hi" + (" <= 1" if kind == "range01" else ""))
        return (float(value[0]), float(value[1]))
    raise AssertionError(kind)


def _take(table: Any, where: str, spec: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """Read ``spec``'s keys from ``table``; unknown keys and missing required keys are errors."""
    if not isinstance(table, dict):
        raise ProfileError(f"{where}: expected a table")
    unknown = sorted(set(table) - set(spec))
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(spec)})")
    out = {}
    for key, (kind, default) in spec.items():
        if key in table:
            out[key] = _check(f"{where}.{key}", table[key], kind)
        elif default is _REQUIRED:
            raise ProfileError(f"{where}.{key}: missing required key")
        else:
            out[key] = default
    return out


_CLUSTER: Final = {
    "gpus_per_node": ("int+", _REQUIRED),
    "interruptions_per_gpu_day": ("float+", _REQUIRED),
    "rate_multiplier": ("float+", 1.0),
    "ib_ports_per_node": ("int+", None),
    "gpu_model": ("str", "NVIDIA H100 80GB HBM3"),
    "repair_median_hours": ("float+", 4.0),
    "repair_sigma": ("float0", 1.0),
}
_FAILURE: Final = {
    "cause": ("str", _REQUIRED),
    "share": ("prob", _REQUIRED),
    "xid": ("ints", _REQUIRED),
    "precursor": ("str", _REQUIRED),
    "lead_minutes": ("range", _REQUIRED),
    "detectable": ("prob", _REQUIRED),
    "scope": ("str", "gpu"),
    "repair_median_hours": ("float+", None),
    "repair_sigma": ("float0", None),
}
_NOISE: Final = {
    "benign_xid_per_gpu_day": ("float0", _REQUIRED),
    "benign_xids": ("ints", (13, 31, 43)),
    "false_alarms_per_failure": ("float0", 1.0),
    "false_alarm_strength": ("range01", (0.15, 0.6)),
    "sensor_noise": ("float0", 1.0),
    "diurnal_amplitude": ("prob", 0.05),
    "noisy_gpu_fraction": ("prob", 0.03),
    "missing_scrape_fraction": ("prob", 0.0),
}
_REFAULT: Final = {
    "failed_repair_probability": ("prob", _REQUIRED),
    "failed_repair_median_hours": ("float+", _REQUIRED),
    "failed_repair_sigma": ("float0", _REQUIRED),
    "lemon_fraction": ("prob", _REQUIRED),
    "lemon_rate_multiplier": ("float+", _REQUIRED),
}
_TABLES: Final = ("description", "cluster", "failure", "noise", "refault")
_SHARE_TOLERANCE: Final = 1e-3


def parse_profile(data: dict[str, Any], name: str) -> Profile:
    """Build a :class:`Profile` from parsed TOML, or raise :class:`ProfileError` naming the key."""
    unknown = sorted(set(data) - set(_TABLES))
    if unknown:
        raise ProfileError(f"{unknown[0]}: unknown key (known: {', '.join(_TABLES)}, extends)")
    description = _check("description", data.get("description", ""), "str")
    c = _take(data.get("cluster", {}), "cluster", _CLUSTER)
    c["ib_ports_per_node"] = c["ib_ports_per_node"] or c["gpus_per_node"]
    cluster = Cluster(**c)
    if not isinstance(data.get("failure"), list) or not data["failure"]:
        raise ProfileError("failure: missing required [[failure]] tables (at least one)")
    failures = []
    for i, table in enumerate(data["failure"]):
        where = f"failure[{i}]"
        f = _take(table, where, _FAILURE)
        if f["precursor"] not in PRECURSORS:
            raise ProfileError(f"{where}.precursor: {f['precursor']!r} is not one of {', '.join(PRECURSORS)}")
        if f["precursor"] == "none" and f["detectable"] > 0:
            raise ProfileError(
                f'{where}.detectable: must be 0 when precursor is "none" (got {f["detectable"]})'
            )
        if f["scope"] not in ("gpu", "node"):
            raise ProfileError(f'{where}.scope: expected "gpu" or "node" (got {f["scope"]!r})')
        if f["repair_median_hours"] is None:
            f["repair_median_hours"] = cluster.repair_median_hours
        if f["repair_sigma"] is None:
            f["repair_sigma"] = cluster.repair_sigma
        failures.append(FailureClass(**f))
    causes = [f.cause for f in failures]
    duplicate = next((c for c in causes if causes.count(c) > 1), None)
    if duplicate:
        raise ProfileError(f"failure.cause: {duplicate!r} appears more than once")
    total = sum(f.share for f in failures)
    if abs(total - 1.0) > _SHARE_TOLERANCE:
        raise ProfileError(f"failure.share: shares add up to {total:.4f}, not 1")
    if "noise" not in data:
        raise ProfileError("noise: missing required table")
    noise = Noise(**_take(data["noise"], "noise", _NOISE))
    refault = None
    if "refault" in data:
        refault = Refault(**_take(data["refault"], "refault", _REFAULT))
        if refault.lemon_rate_multiplier < 1:
            raise ProfileError(f"refault.lemon_rate_multiplier: expected a number >= 1 "
                               f"(got {refault.lemon_rate_multiplier!r})")
        if refault.failed_repair_probability >= 1:
            raise ProfileError("refault.failed_repair_probability: expected a number < 1 (got 1.0)")
    return Profile(name=name, description=description, cluster=cluster, failures=tuple(failures),
                   noise=noise, refault=refault)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None


def read_profile_data(path: str | Path) -> dict[str, Any]:
    """A profile file's TOML as a dict, ``extends`` resolved (one level: the base may not extend)."""
    path = Path(path)
    data = _read_toml(path)
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or not base_name:
        raise ProfileError(f"{path.name}: extends: expected a profile name (got {base_name!r})")
    base = _read_toml(path.with_name(f"{base_name}.toml"))
    if "extends" in base:
        raise ProfileError(f"{path.name}: extends: {base_name!r} extends another profile (one level only)")
    return {**base, **data}


def load_profile(path: str | Path) -> Profile:
    """Read and validate a TOML profile file; the profile's name is the file's stem."""
    path = Path(path)
    data = read_profile_data(path)
    try:
        return parse_profile(data, path.stem)
    except ProfileError as exc:
        raise ProfileError(f"{path.name}: {exc}") from None
