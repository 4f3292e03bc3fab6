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
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "PRECURSORS",
    "ProfileError",
    "FailureClass",
    "Cluster",
    "Noise",
    "Profile",
    "parse_profile",
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
class Profile:
    name: str
    description: str
    cluster: Cluster
    failures: tuple[FailureClass, ...]
    noise: Noise

    def node_failures_per_day(self, rate_multiplier: float | None = None) -> float:
        """Failure rate of one up node: GPUs per node x rate per GPU-day x multiplier."""
        mult = self.cluster.rate_multiplier if rate_multiplier is None else rate_multiplier
        return self.cluster.gpus_per_node * self.cluster.interruptions_per_gpu_day * mult


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
_SHARE_TOLERANCE: Final = 1e-3


def parse_profile(data: dict[str, Any], name: str) -> Profile:
    """Build a :class:`Profile` from parsed TOML, or raise :class:`ProfileError` naming the key."""
    unknown = sorted(set(data) - {"description", "cluster", "failure", "noise"})
    if unknown:
        raise ProfileError(f"{unknown[0]}: unknown key (known: description, cluster, failure, noise)")
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
    return Profile(name=name, description=description, cluster=cluster, failures=tuple(failures), noise=noise)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a TOML profile file; the profile's name is the file's stem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_profile(data, path.stem)
    except ProfileError as exc:
        raise ProfileError(f"{path.name}: {exc}") from None
