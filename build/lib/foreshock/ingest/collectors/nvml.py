"""NVML collector (nvidia-ml-py, imported as ``pynvml``): one GpuSample per GPU per poll, plus Xids.

Per GPU: temperatures (GPU, memory), power (W), SM and memory clocks (MHz), utilisation (%),
framebuffer used/free (MiB), volatile and aggregate single/double-bit ECC totals, retired pages
(single-bit, double-bit, pending), remapped rows (correctable, uncorrectable, pending, failure),
PCIe replay counter, NVLink CRC-flit/CRC-data/replay/recovery error counters summed over the
GPU's links, clock-event (throttle) reasons, power and thermal violation time (ns) and total
energy (mJ). Field names and units follow DCGM so NVML and dcgm-exporter fill the same columns.
A query the GPU or driver does not support leaves its field ``None``; nothing is made up.

Xid events come from NVML's event API (``nvmlEventTypeXidCriticalError``) where the driver offers
it; they are folded like kernel-log Xids and carry the same policy severity and action.

The ``pynvml`` module is a parameter: production passes the real one, and tests without a GPU pass
a stand-in object with the same functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from foreshock.ingest.collectors.base import CollectorOptions, CollectorUnavailable, register_collector
from foreshock.ingest.collectors.fold import XidFolder
from foreshock.ingest.collectors.pci import normalize_pci_bus_id
from foreshock.ingest.collectors.xid_policy import XidPolicy, load_xid_policy
from foreshock.ingest.contract import GpuSample, XidEvent

__all__ = ["NvmlCollector", "open_nvml"]

_MIB = 1024 * 1024
# (field, NVML error-counter constant name) summed over every NVLink of the GPU
_NVLINK_COUNTERS = (
    ("nvlink_crc_flit_error_count_total", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("nvlink_crc_data_error_count_total", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    ("nvlink_replay_error_count_total", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("nvlink_recovery_error_count_total", "NVML_NVLINK_ERROR_DL_RECOVERY"),
)
_ECC = (
    ("ecc_sbe_vol_total", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_dbe_vol_total", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_sbe_agg_total", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
    ("ecc_dbe_agg_total", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
)
_FIELD_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def open_nvml(nvml: Any = None) -> Any:
    """Initialise NVML and return the module; one clear sentence when there is no NVML or no GPU."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            raise CollectorUnavailable(
                "the nvidia-ml-py package (pynvml) is not installed; install it or use --source dcgm."
            ) from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise CollectorUnavailable(
            f"NVML is not available on this machine ({exc}): run on a GPU node with the NVIDIA driver, "
            "or use --source dcgm."
        ) from None
    if nvml.nvmlDeviceGetCount() == 0:
        nvml.nvmlShutdown()
        raise CollectorUnavailable("NVML found no NVIDIA GPU on this machine.")
    return nvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Poll every GPU through an initialised ``nvml`` module (see :func:`open_nvml`)."""

    def __init__(self, nvml: Any, node: str, clock: Callable[[], int], policy: XidPolicy,
                 folder: XidFolder | None = None):
        self.nvml = nvml
        self.node = node
        self.clock = clock
        self.policy = policy
        self.folder = folder or XidFolder()
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.identity = [self._identity(h) for h in self.handles]
        self.last_xid: dict[int, int] = {}
        self.events = self._register_xid_events()

    # --- one value, or None when unsupported ---------------------------------------------------
    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _const(self, name: str) -> Any:
        return getattr(self.nvml, name)

    def _identity(self, handle: Any) -> dict[str, Any]:
        pci = self._try(self.nvml.nvmlDeviceGetPciInfo, handle)
        uuid = self._try(self.nvml.nvmlDeviceGetUUID, handle)
        name = self._try(self.nvml.nvmlDeviceGetName, handle)
        bus = normalize_pci_bus_id(_text(pci.busId)) if pci is not None else None
        return {"uuid": _text(uuid) if uuid is not None else None, "pci_bus_id": bus,
                "model_name": _text(name) if name is not None else None}

    def _register_xid_events(self) -> Any:
        try:
            events = self.nvml.nvmlEventSetCreate()
        except self.nvml.NVMLError:
            return None
        registered = 0
        for handle in self.handles:
            try:
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except self.nvml.NVMLError:  # not supported on this GPU (e.g. some vGPUs)
                continue
        return events if registered else None

    # --- the poll --------------------------------------------------------------------------------
    def collect(self) -> list[Any]:
        ts = self.clock()
        records: list[Any] = self._xid_events(ts)
        for index, handle in enumerate(self.handles):
            fields = {k: v for k, v in self._fields(index, handle).items() if v is not None}
            records.append(GpuSample(node=self.node, ts=ts, gpu=index, **self.identity[index], **fields))
        records.extend(self.folder.expire(ts))
        return records

    def drain(self) -> list[Any]:
        """Held-back Xid folds; then NVML is shut down."""
        out = self.folder.drain()
        if self.events is not None:
            self._try(self.nvml.nvmlEventSetFree, self.events)
        self._try(self.nvml.nvmlShutdown)
        return out

    def _fields(self, index: int, h: Any) -> dict[str, Any]:
        n, t = self.nvml, self._try
        f: dict[str, Any] = {
            "gpu_temp": t(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "memory_temp": self._field_value(h, "NVML_FI_DEV_MEMORY_TEMP"),
            "sm_clock": t(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "mem_clock": t(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "pcie_replay_counter": t(n.nvmlDeviceGetPcieReplayCounter, h),
            "total_energy_consumption": t(n.nvmlDeviceGetTotalEnergyConsumption, h),
            "clocks_event_reasons": t(getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                      or n.nvmlDeviceGetCurrentClocksThrottleReasons, h),
            "xid_errors": self.last_xid.get(index, 0) if self.events is not None else None,
        }
        power_mw = t(n.nvmlDeviceGetPowerUsage, h)
        f["power_usage"] = power_mw / 1000.0 if power_mw is not None else None
        util = t(n.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            f["gpu_util"], f["mem_copy_util"] = float(util.gpu), float(util.memory)
        memory = t(n.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            f["fb_used"], f["fb_free"] = memory.used / _MIB, memory.free / _MIB
        for field, error_type, counter_type in _ECC:
            f[field] = t(n.nvmlDeviceGetTotalEccErrors, h, self._const(error_type), self._const(counter_type))
        sbe = t(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = t(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        f["retired_sbe"] = len(sbe) if sbe is not None else None
        f["retired_dbe"] = len(dbe) if dbe is not None else None
        pending = t(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        f["retired_pending"] = int(pending) if pending is not None else None
        rows = t(n.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            (f["correctable_remapped_rows"], f["uncorrectable_remapped_rows"],
             f["row_remap_pending"], f["row_remap_failure"]) = (int(x) for x in rows)
        for field, policy in (("power_violation", "NVML_PERF_POLICY_POWER"),
                              ("thermal_violation", "NVML_PERF_POLICY_THERMAL")):
            violation = t(n.nvmlDeviceGetViolationStatus, h, self._const(policy))
            f[field] = int(violation.violationTime) if violation is not None else None
        f.update(self._nvlink(h))
        return f

    def _field_value(self, h: Any, const: str) -> float | None:
        field_id = getattr(self.nvml, const, None)
        if field_id is None:
            return None
        values = self._try(self.nvml.nvmlDeviceGetFieldValues, h, [field_id])
        if not values or values[0].nvmlReturn != 0:
            return None
        attr = _FIELD_VALUE_ATTR.get(int(values[0].valueType))
        return float(getattr(values[0].value, attr)) if attr else None

    def _nvlink(self, h: Any) -> dict[str, int]:
        """Counters summed over the links NVML reports; no supported link -> no fields."""
        totals: dict[str, int] = {}
        for link in range(self.nvml.NVML_NVLINK_MAX_LINKS):
            if self._try(self.nvml.nvmlDeviceGetNvLinkState, h, link) is None:
                continue
            for field, const in _NVLINK_COUNTERS:
                value = self._try(self.nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, self._const(const))
                if value is not None:
                    totals[field] = totals.get(field, 0) + int(value)
        return totals

    def _xid_events(self, ts: int) -> list[XidEvent]:
        if self.events is None:
            return []
        out: list[XidEvent] = []
        for _ in range(10_000):  # bounded drain of what is queued
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing queued
                break
            index = self._try(self.nvml.nvmlDeviceGetIndex, data.device)
            xid = int(data.eventData)
            if index is not None:
                self.last_xid[index] = xid
            rule = self.policy.lookup(xid)
            ident = self.identity[index] if index is not None and index < len(self.identity) else {}
            event = XidEvent(node=self.node, ts=ts, xid=xid, gpu=index, pci_bus_id=ident.get("pci_bus_id"),
                             message=f"NVML Xid event {xid}", severity=rule.severity, action=rule.action)
            out.extend(self.folder.offer(event))
        return out


@register_collector("nvml")
def _create(options: CollectorOptions) -> NvmlCollector:
    nvml = open_nvml(options.nvml)
    return NvmlCollector(nvml, options.node, options.clock, load_xid_policy(options.xid_policy_override),
                         XidFolder(options.fold_window_ms))
