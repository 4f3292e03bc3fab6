"""NVML collector.

No GPU exists on the machines that run this suite, so:
- the real ``pynvml`` is exercised only for its absence (one clear sentence, no traceback);
- the field mapping is exercised with ``StandInNvml`` below, a STAND-IN for the pynvml module
  (same function names, constants and error classes, values chosen by this test), passed to the
  collector as its injected NVML handle. It proves the mapping and unit conversions, not NVML.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pynvml
import pytest

from foreshock.ingest.collectors import CollectorOptions, CollectorUnavailable, create_collector
from foreshock.ingest.collectors.nvml import NvmlCollector, open_nvml
from foreshock.ingest.collectors.xid_policy import load_xid_policy
from foreshock.ingest.contract import Topic, XidEvent, decode, encode


def _has_gpu() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


class StandInNvml:
    """STAND-IN for the pynvml module: GPU 0 is an 'H100' with NVLinks; GPU 1 supports little."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_Timeout = pynvml.NVMLError_Timeout

    def __init__(self, gpus: int = 2):
        for name in dir(pynvml):  # the real constants, so the collector cannot depend on made-up ones
            if name.startswith(("NVML_", "nvmlEventType")) and isinstance(getattr(pynvml, name), int):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.queued_xids: list[tuple[int, int]] = []
        self.initialised = False

    def _unsupported(self):
        raise pynvml.NVMLError_NotSupported()

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetIndex(self, h):
        return h[1]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3" if h[1] == 0 else "NVIDIA A10"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h[1]:02X}:00.0".encode())

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 41 + h[1]

    def nvmlDeviceGetFieldValues(self, h, ids):
        if h[1] == 1:
            self._unsupported()
        value = SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=52))
        return [value]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetPowerUsage(self, h):
        return 312_456  # mW

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=40 * 1024**3, free=40 * 1024**3, total=80 * 1024**3)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        if h[1] == 1:
            self._unsupported()  # ECC off on this GPU
        return {(0, 0): 3, (1, 0): 0, (0, 1): 120, (1, 1): 1}[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, h, cause):
        self._unsupported()  # Hopper retires rows, not pages

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        self._unsupported()

    def nvmlDeviceGetRemappedRows(self, h):
        if h[1] == 1:
            self._unsupported()
        return (2, 1, 1, 0)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return 17

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h[1] == 1 or link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return {pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 1, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 0,
                pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 2, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 0}[counter]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4

    def nvmlDeviceGetViolationStatus(self, h, policy):
        return SimpleNamespace(referenceTime=0, violationTime=5_000 if policy == 0 else 9_000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        assert types == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.queued_xids:
            raise pynvml.NVMLError_Timeout()
        gpu, xid = self.queued_xids.pop(0)
        return SimpleNamespace(device=("handle", gpu), eventData=xid, eventType=8)

    def nvmlEventSetFree(self, event_set):
        pass


def test_no_nvml_library_is_one_clear_sentence():
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    with pytest.raises(CollectorUnavailable) as err:
        create_collector("nvml", CollectorOptions(node="n"))
    message = str(err.value)
    assert "NVML is not available" in message and "\n" not in message and message.endswith(".")


def test_cli_without_nvml_exits_1_without_traceback():
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", "foreshock", "collect", "--source", "nvml", "--node", "n",
                           "--stdout"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "NVML is not available" in proc.stderr


def test_no_gpu_is_one_clear_sentence():
    with pytest.raises(CollectorUnavailable, match="found no NVIDIA GPU"):
        open_nvml(StandInNvml(gpus=0))


def test_field_mapping_with_the_stand_in():
    nvml = StandInNvml()
    collector = create_collector("nvml", CollectorOptions(node="node0003", nvml=nvml, clock=lambda: 77))
    assert isinstance(collector, NvmlCollector) and nvml.initialised
    h100, a10 = collector.collect()
    assert (h100.node, h100.ts, h100.gpu) == ("node0003", 77, 0)
    assert (h100.pci_bus_id, h100.model_name) == ("0000:18:00.0", "NVIDIA H100 80GB HBM3")
    assert h100.uuid.startswith("GPU-00000000")
    assert (h100.gpu_temp, h100.memory_temp, h100.sm_clock, h100.mem_clock) == (41, 52.0, 1980, 2619)
    assert h100.power_usage == pytest.approx(312.456)            # mW -> W
    assert (h100.gpu_util, h100.mem_copy_util) == (97.0, 41.0)
    assert (h100.fb_used, h100.fb_free) == (40 * 1024.0, 40 * 1024.0)  # bytes -> MiB
    assert (h100.ecc_sbe_vol_total, h100.ecc_dbe_vol_total, h100.ecc_sbe_agg_total,
            h100.ecc_dbe_agg_total) == (3, 0, 120, 1)
    assert (h100.correctable_remapped_rows, h100.uncorrectable_remapped_rows,
            h100.row_remap_pending, h100.row_remap_failure) == (2, 1, 1, 0)
    assert h100.pcie_replay_counter == 17 and h100.clocks_event_reasons == 4
    assert (h100.nvlink_crc_flit_error_count_total, h100.nvlink_replay_error_count_total,
            h100.nvlink_crc_data_error_count_total) == (18, 36, 0)   # summed over 18 links
    assert (h100.power_violation, h100.thermal_violation) == (5_000, 9_000)
    assert h100.total_energy_consumption == 123_456_789 and h100.xid_errors == 0
    # unsupported queries are left out, not faked
    assert h100.retired_sbe is None and h100.retired_dbe is None and h100.retired_pending is None
    assert a10.ecc_sbe_vol_total is None and a10.correctable_remapped_rows is None
    assert a10.memory_temp is None and a10.nvlink_crc_flit_error_count_total is None
    assert a10.gpu_temp == 42 and a10.model_name == "NVIDIA A10"
    assert decode(Topic.GPU, encode([h100, a10])) == [h100, a10]


def test_xid_events_through_the_event_api_are_folded_and_classified():
    nvml = StandInNvml()
    collector = NvmlCollector(open_nvml(nvml), "n", lambda: 1_000, load_xid_policy())
    nvml.queued_xids = [(1, 79)] * 5 + [(0, 48)]
    records = collector.collect()
    xids = [r for r in records if isinstance(r, XidEvent)]
    assert [(e.xid, e.gpu, e.count, e.severity) for e in xids] == [(79, 1, 1, "FATAL"), (48, 0, 1, "FATAL")]
    assert xids[0].pci_bus_id == "0000:19:00.0"
    samples = [r for r in records if not isinstance(r, XidEvent)]
    assert [s.xid_errors for s in samples] == [48, 79]  # last Xid per GPU, as DCGM reports it
    rest = collector.drain()
    assert [(e.xid, e.count) for e in rest] == [(79, 4)] and not nvml.initialised
