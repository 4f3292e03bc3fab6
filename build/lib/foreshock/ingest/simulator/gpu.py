"""GPU telemetry of one time chunk, all nodes x GPUs x steps at once.

Healthy physics first: a training job keeps GPUs busy with a small diurnal swing; power follows
load, temperature follows power plus a per-node and per-GPU offset (airflow, position in the
chassis), sensors are quantised like the real ones (integer degrees, integer MHz). Clocks drop
and violation counters grow when a GPU runs hot or hits its power cap. Rare corrected errors
(ECC single-bit, PCIe replays, NVLink CRC) tick on healthy parts, and a few "noisy" GPUs have
far more of them without ever failing.

Foreshock episodes then add their signature, scaled by the episode's intensity at each step:
``ecc``: single-bit error bursts, row remaps (Xid 63, pending remap), Xid 92 at heavy bursts;
``thermal``: a temperature drift of several degrees that ends in throttling; ``nvlink``: CRC,
replay and recovery growth; ``power``: excursions with power-brake slowdowns; ``pcie``: replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from foreshock.ingest.simulator.counters import (
    Background,
    Increments,
    KeptRows,
    cumsum_steps,
    cumulative,
    stateful_gauge,
)
from foreshock.ingest.simulator.profile import Profile
from foreshock.ingest.simulator.schedule import Episode, Failure, intensities

__all__ = ["GpuBaseline", "GpuChunk", "GpuGenerator", "XID_MESSAGES", "pci_bus_ids"]

_F32 = np.float32
FB_TOTAL_MIB: Final = 81_559.0
POWER_CAP_W: Final = 700.0
IDLE_POWER_W: Final = 70.0
MAX_SM_CLOCK: Final = 1980.0
MEM_CLOCK: Final = 2619.0
THROTTLE_SW_C: Final = 85.0
THROTTLE_HW_C: Final = 90.0
# clocks_event_reasons bits (NVML clocksEventReasons)
SW_POWER_CAP: Final = 0x4
HW_SLOWDOWN: Final = 0x8
SW_THERMAL: Final = 0x20
HW_THERMAL: Final = 0x40
HW_POWER_BRAKE: Final = 0x80
# background corrected-error rates, events per unit-hour (median of a lognormal across units)
_SBE_PER_HOUR: Final = 0.002
_NOISY_SBE_FACTOR: Final = 300.0
_PCIE_PER_HOUR: Final = 0.01
_NVLINK_PER_HOUR: Final = 0.02
# foreshock rates per hour at intensity 1
_ECC_SBE: Final = 900.0
_ECC_CORR_REMAP: Final = 3.0
_ECC_UNCORR_REMAP: Final = 0.6
_XID92_BURST: Final = 60
_NVLINK: Final = {
    "nvlink_crc_flit_error_count_total": 400.0,
    "nvlink_crc_data_error_count_total": 40.0,
    "nvlink_replay_error_count_total": 25.0,
    "nvlink_recovery_error_count_total": 0.8,
}
_PCIE: Final = 150.0
_POWER_SPIKES: Final = 25.0
_THERMAL_DRIFT_C: Final = 20.0

# the text after "pid=..., name=...," in real kernel-log lines (shared/realdata/xid/xid_lines.txt)
XID_MESSAGES: Final[dict[int, str]] = {
    13: "Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14 faulted @ 0x7f2f_cca58000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
    "0x12bac1c3e0 partition 2, subpartition 1.",
    63: "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row",
    74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    119: "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) "
    "(0x2081 0x4).",
    120: "Ch 00000005",
}

_COUNTERS: Final = (
    "ecc_sbe",
    "ecc_dbe",
    "correctable_remapped_rows",
    "uncorrectable_remapped_rows",
    "pcie_replay_counter",
    *_NVLINK,
    "power_violation",
    "thermal_violation",
)


def pci_bus_ids(gpus: int) -> tuple[str, ...]:
    """PCI bus ids of a node's GPUs (the same on every node, as on an HGX board)."""
    return tuple(f"00000000:{0x18 + 0x11 * i:02X}:00.0" for i in range(gpus))


@dataclass(frozen=True, slots=True)
class GpuBaseline:
    """Per-node and per-GPU constants drawn once per run (what makes nodes differ)."""

    temp_offset: np.ndarray
    mem_offset: np.ndarray
    util_level: np.ndarray
    watts_per_util: np.ndarray
    phase_days: np.ndarray
    fb_used: np.ndarray
    sbe_rate_h: np.ndarray
    pcie_rate_h: np.ndarray
    nvlink_rate_h: np.ndarray

    @classmethod
    def draw(cls, profile: Profile, nodes: int, rng: np.random.Generator) -> GpuBaseline:
        g = profile.cluster.gpus_per_node
        shape = (nodes, g)
        noisy = rng.random(shape) < profile.noise.noisy_gpu_fraction
        return cls(
            temp_offset=(rng.normal(0, 2.0, (nodes, 1)) + rng.normal(0, 1.5, shape)).astype(_F32),
            mem_offset=rng.normal(7.0, 1.5, shape).astype(_F32),
            util_level=rng.uniform(88.0, 97.0, (nodes, 1)).astype(_F32),
            watts_per_util=(rng.normal(1.0, 0.03, shape) * (POWER_CAP_W - IDLE_POWER_W) * 0.0093).astype(
                _F32
            ),
            phase_days=rng.normal(0.0, 0.02, (nodes, 1)),
            fb_used=np.rint(rng.uniform(55_000, 76_000, (nodes, 1)) + rng.normal(0, 300, shape)),
            sbe_rate_h=rng.lognormal(np.log(_SBE_PER_HOUR), 1.0, shape)
            * np.where(noisy, _NOISY_SBE_FACTOR, 1.0),
            pcie_rate_h=rng.lognormal(np.log(_PCIE_PER_HOUR), 1.0, shape),
            nvlink_rate_h=rng.lognormal(np.log(_NVLINK_PER_HOUR), 1.0, shape),
        )


@dataclass(slots=True)
class GpuChunk:
    """Flat columns in (step, node, gpu) order, rows of down nodes left out, plus the chunk's Xids."""

    columns: dict[str, np.ndarray]
    xid_ts: np.ndarray
    xid_node: np.ndarray
    xid_gpu: np.ndarray
    xid_code: np.ndarray


class GpuGenerator:
    """Generates GPU chunks in time order, carrying counters and gauges from one to the next."""

    def __init__(self, profile: Profile, nodes: int, interval_ms: int, baseline: GpuBaseline):
        self.profile = profile
        self.nodes = nodes
        self.gpus = profile.cluster.gpus_per_node
        self.interval_ms = interval_ms
        self.hours = interval_ms / 3_600_000
        self.base = baseline
        shape = (nodes, self.gpus)
        self._carry = {name: np.zeros(shape, dtype=np.int64) for name in ("vol_sbe", "vol_dbe", *_COUNTERS)}
        self._energy = np.zeros(shape, dtype=np.float64)
        self._remap_pending = np.zeros(shape, dtype=np.int64)
        self._last_xid = np.zeros(shape, dtype=np.int64)
        self._pending_sets: list[tuple[int, int, int | None, int]] = []
        self._background = {
            "ecc_sbe": Background(baseline.sbe_rate_h * self.hours, burst_mean=3.0),
            "pcie_replay_counter": Background(baseline.pcie_rate_h * self.hours),
            "nvlink_crc_flit_error_count_total": Background(baseline.nvlink_rate_h * self.hours),
        }

    def generate(
        self,
        rng: np.random.Generator,
        ts: np.ndarray,
        up: np.ndarray | None,
        rows: KeptRows,
        episodes: list[Episode],
        repairs: list[tuple[int, Failure]],
    ) -> GpuChunk:
        """One chunk; ``up`` (steps, nodes) says which nodes run, ``rows`` which GPU rows are kept
        (those of nodes scraped). ``repairs`` are (step, failure) for nodes back up at that step.
        """
        steps, n, g = ts.size, self.nodes, self.gpus
        noise = self.profile.noise.sensor_noise
        base = self.base
        days = ts.astype(np.float64)[:, None] / 86_400_000.0 + base.phase_days[None, :, :].reshape(1, n)
        diurnal = np.sin(2 * np.pi * (days - 0.625)).astype(_F32)[:, :, None]  # peak mid-afternoon UTC
        amp = self.profile.noise.diurnal_amplitude
        shape = (steps, n, g)
        # gauges are built in place, in float32: this is the hot loop of the simulator
        util = rng.standard_normal(shape, _F32)
        util *= 2 * noise
        util += base.util_level[None] * (1 + amp * diurnal)
        np.clip(util, 0, 100, out=util)
        power = rng.standard_normal(shape, _F32)
        power *= 8 * noise
        power += util * base.watts_per_util[None]
        power += IDLE_POWER_W
        temp = rng.standard_normal(shape, _F32)
        temp *= 0.6 * noise
        temp += 0.05 * power
        temp += 28 + 2 * diurnal
        temp += base.temp_offset[None]
        mem_temp = rng.standard_normal(shape, _F32)
        mem_temp *= 0.5 * noise
        mem_temp += temp
        mem_temp += base.mem_offset[None]

        inc = {name: Increments() for name in _COUNTERS}
        xids: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        gauge_sets: list[tuple[int, int, int | None, int]] = []
        brake: list[tuple[int, int, int]] = []
        for name, background in self._background.items():
            background.scatter(rng, steps, inc[name])
        for ep, x in zip(episodes, intensities(episodes, ts), strict=True):
            active = np.flatnonzero(x > 0)
            if active.size == 0:
                continue
            units = range(g) if ep.gpu is None else (ep.gpu % g,)
            if ep.kind == "thermal":
                drift = (_THERMAL_DRIFT_C * x).astype(_F32)
                where = slice(None) if ep.gpu is None else ep.gpu % g
                temp[:, ep.node, where] += drift[:, None] if ep.gpu is None else drift
                mem_temp[:, ep.node, where] += 1.2 * (drift[:, None] if ep.gpu is None else drift)
                continue
            for unit in units:
                self._episode_counters(rng, ep, unit, x, active, inc, xids, brake, power)

        reasons, sm_clock = self._throttling(temp, power, brake, inc)

        # random application Xids on healthy GPUs
        rate = self.profile.noise.benign_xid_per_gpu_day * n * g * steps * self.interval_ms / 86_400_000
        benign = np.asarray(self.profile.noise.benign_xids, dtype=np.int64)
        k = int(rng.poisson(rate)) if rate > 0 and benign.size else 0
        if k:
            s, nn, gg = rng.integers(0, steps, k), rng.integers(0, n, k), rng.integers(0, g, k)
            codes = benign[rng.integers(0, benign.size, k)]
            xids.append((s, nn, gg, codes))
        xid_s, xid_n, xid_g, xid_c = (
            np.concatenate([np.asarray(x[i], dtype=np.int64) for x in xids])
            if xids
            else np.zeros(0, np.int64)
            for i in range(4)
        )
        if up is not None and xid_s.size:
            keep = up[xid_s, xid_n]
            xid_s, xid_n, xid_g, xid_c = xid_s[keep], xid_n[keep], xid_g[keep], xid_c[keep]
        gauge_sets += [
            (int(s), int(nn), int(gg), int(c))
            for s, nn, gg, c in zip(xid_s, xid_n, xid_g, xid_c, strict=True)
        ]
        xid_ts = ts[xid_s] - rng.integers(0, self.interval_ms, xid_s.size)

        watts = power.astype(np.float64)  # reported with 10 mW resolution
        watts *= 100
        np.rint(watts, out=watts)
        watts /= 100
        cols = self._counters(rows, inc, repairs, watts, up, gauge_sets)
        mem_copy = util * 0.42
        for gauge in (temp, mem_temp, util, mem_copy, sm_clock):  # sensors report whole units
            np.rint(gauge, out=gauge)
        gauges = {
            "gpu_temp": temp,
            "memory_temp": mem_temp,
            "power_usage": watts,
            "sm_clock": sm_clock,
            "gpu_util": util,
            "mem_copy_util": mem_copy,
        }
        cols.update((name, rows.select(gauge, np.float64)) for name, gauge in gauges.items())
        cols["clocks_event_reasons"] = rows.select(reasons, np.int64)
        cols["mem_clock"] = np.full(rows.size, MEM_CLOCK)
        cols["fb_used"] = rows.per_unit(base.fb_used)
        cols["fb_free"] = rows.per_unit(FB_TOTAL_MIB - base.fb_used)
        return GpuChunk(
            cols,
            xid_ts.astype(np.int64),
            xid_n.astype(np.int64),
            xid_g.astype(np.int64),
            xid_c.astype(np.int64),
        )

    def _episode_counters(
        self,
        rng: np.random.Generator,
        ep: Episode,
        unit: int,
        x: np.ndarray,
        active: np.ndarray,
        inc: dict[str, Increments],
        xids: list,
        brake: list[tuple[int, int, int]],
        power: np.ndarray,
    ) -> None:
        """Counter-type signatures of one episode on one GPU."""
        lam = x[active] * self.hours
        if ep.kind == "ecc":
            bursts = rng.poisson(lam * _ECC_SBE / 4)
            sizes = bursts * rng.geometric(1 / (1 + 4 * x[active]))
            inc["ecc_sbe"].add(active, ep.node, unit, sizes)
            heavy = active[sizes >= _XID92_BURST]
            heavy = heavy[rng.random(heavy.size) < 0.3]
            xids.append(
                (heavy, np.full(heavy.size, ep.node), np.full(heavy.size, unit), np.full(heavy.size, 92))
            )
            inc["correctable_remapped_rows"].add(active, ep.node, unit, rng.poisson(lam * _ECC_CORR_REMAP))
            remap = active[rng.poisson(lam * _ECC_UNCORR_REMAP) > 0]
            inc["uncorrectable_remapped_rows"].add(remap, ep.node, unit, 1)
            xids.append(
                (remap, np.full(remap.size, ep.node), np.full(remap.size, unit), np.full(remap.size, 63))
            )
            if remap.size:
                self._pending_sets.append((int(remap[0]), ep.node, unit, 1))
        elif ep.kind == "nvlink":
            for name, per_hour in _NVLINK.items():
                inc[name].add(active, ep.node, unit, rng.poisson(lam * per_hour))
        elif ep.kind == "pcie":
            inc["pcie_replay_counter"].add(active, ep.node, unit, rng.poisson(lam * _PCIE))
        elif ep.kind == "power":
            spikes = active[rng.random(active.size) < lam * _POWER_SPIKES]
            power[spikes, ep.node, unit] += rng.uniform(120, 260, spikes.size).astype(_F32)
            brake.extend((int(s), ep.node, unit) for s in spikes)

    def _throttling(
        self,
        temp: np.ndarray,
        power: np.ndarray,
        brake: list[tuple[int, int, int]],
        inc: dict[str, Increments],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Clock-event reasons and SM clock; violation counters grow while throttled.

        Throttling is rare, so it is computed on the few hot or capped samples only.
        """
        n, g = self.nodes, self.gpus
        reasons = np.zeros(temp.shape, dtype=np.int64)
        sm_clock = np.full(temp.shape, MAX_SM_CLOCK, dtype=_F32)
        r, sm, t = reasons.reshape(-1), sm_clock.reshape(-1), temp.reshape(-1)
        hot = np.flatnonzero(t > THROTTLE_SW_C - 2)
        sm[hot] -= np.minimum((t[hot] - (THROTTLE_SW_C - 2)) * 45, 900)
        sw = hot[t[hot] > THROTTLE_SW_C]
        r[sw] |= SW_THERMAL
        r[hot[t[hot] > THROTTLE_HW_C]] |= HW_THERMAL
        capped = np.flatnonzero(power.reshape(-1) > POWER_CAP_W)
        r[capped] |= SW_POWER_CAP
        sm[capped] -= 120
        braked = np.array([(s * n + node) * g + unit for s, node, unit in brake], dtype=np.int64)
        r[braked] |= HW_POWER_BRAKE | HW_SLOWDOWN
        sm[braked] *= 0.5
        np.minimum(power, POWER_CAP_W + 150, out=power)
        us = self.interval_ms * 1000
        for name, rows in (("thermal_violation", sw), ("power_violation", np.union1d(capped, braked))):
            inc[name].add(rows // (n * g), (rows // g) % n, rows % g, us)
        return reasons, sm_clock

    def _counters(self, rows, inc, repairs, power, up, xid_sets) -> dict[str, np.ndarray]:
        """Cumulative counters and stateful gauges (kept-rows columns), with the resets a repair brings."""
        c = self._carry
        resets = [(s, f.node) for s, f in repairs]
        for s, f in repairs:  # a memory failure shows after the repair, in the lifetime counters
            if f.precursor == "ecc":
                inc["ecc_dbe"].add(np.array([s]), f.node, f.gpu or 0, 1)
        out = {}
        sbe_inc, dbe_inc = inc["ecc_sbe"], inc["ecc_dbe"]
        out["ecc_sbe_vol_total"] = cumulative(c["vol_sbe"], rows, sbe_inc, resets)
        out["ecc_dbe_vol_total"] = cumulative(c["vol_dbe"], rows, dbe_inc, resets)
        out["ecc_sbe_agg_total"] = cumulative(c["ecc_sbe"], rows, sbe_inc)
        out["ecc_dbe_agg_total"] = cumulative(c["ecc_dbe"], rows, dbe_inc)
        for name in _COUNTERS[2:]:  # remapped rows are lifetime (InfoROM); the others restart
            out[name] = cumulative(c[name], rows, inc[name], [] if "remapped" in name else resets)
        energy = power * self.interval_ms  # mJ per step
        if up is not None:
            energy *= up[:, :, None]
        cumsum_steps(energy)
        energy += self._energy[None]
        self._energy[:] = energy[-1]
        out["total_energy_consumption"] = rows.select(energy, np.int64)
        pending = self._pending_sets + [(s, f.node, None, 0) for s, f in repairs]
        self._pending_sets = []
        out["row_remap_pending"] = stateful_gauge(self._remap_pending, rows, pending)
        out["row_remap_failure"] = np.zeros(rows.size, dtype=np.int64)
        out["xid_errors"] = stateful_gauge(
            self._last_xid, rows, xid_sets + [(s, f.node, None, 0) for s, f in repairs]
        )
        return out
