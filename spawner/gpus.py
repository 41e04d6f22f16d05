"""The machine's GPUs: from NVML when it finds any, else simulated from a spec.

GPU spec, as in settings (`gpus.simulate`) and `--simulate`: comma-separated
``COUNTxSIZE[:MODEL]``, for example ``2x16GiB:T4,1x80GiB:H100``.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spawner.inventory import Gpu
from spawner.shares import ShareError, format_bytes, parse_quantity

_ENTRY = re.compile(r"^\s*(?P<count>[0-9]+)\s*[xX]\s*(?P<size>[^:]+?)\s*(?::\s*(?P<model>[^,]*?))?\s*$")
SPEC_EXAMPLE = "2x16GiB:T4,1x80GiB:H100"
DEFAULT_SIMULATE = SPEC_EXAMPLE  # the GPUs simulated where NVML finds none, unless the settings say otherwise


@dataclass(frozen=True)
class GpuSpecEntry:
    count: int
    memory_bytes: int
    model: str

    def __str__(self) -> str:
        return f"{self.count}x{format_bytes(self.memory_bytes).replace(' ', '')}:{self.model}"


def parse_gpu_spec(spec: str) -> list[GpuSpecEntry]:
    """Parse a GPU spec; raises ValueError saying what is wrong and how to write it."""
    entries = []
    for part in spec.split(","):
        if not part.strip():
            continue
        match = _ENTRY.match(part)
        if not match:
            raise ValueError(f"GPU spec entry {part.strip()!r} is not COUNTxSIZE[:MODEL]; for example {SPEC_EXAMPLE!r}")
        try:
            size = parse_quantity(match["size"])
        except ShareError as exc:
            raise ValueError(f"GPU spec entry {part.strip()!r}: {exc}") from None
        count = int(match["count"])
        if count < 1 or size < 1:
            raise ValueError(f"GPU spec entry {part.strip()!r} needs at least one card of some memory")
        entries.append(GpuSpecEntry(count, size, (match["model"] or "").strip() or "simulated"))
    if not entries:
        raise ValueError(f"the GPU spec is empty; write for example {SPEC_EXAMPLE!r}")
    return entries


def simulated_gpus(spec: str, node: str = "localhost") -> list[Gpu]:
    """Cards from a spec, indexed in order and marked simulated."""
    gpus: list[Gpu] = []
    for entry in parse_gpu_spec(spec):
        for _ in range(entry.count):
            index = len(gpus)
            gpus.append(Gpu(node, index, entry.model, entry.memory_bytes, uuid=f"SIM-{node}-{index}", simulated=True))
    return gpus


def _text(value: bytes | str) -> str:
    """NVML returns bytes in older nvidia-ml-py releases and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(nvml: Any, node: str = "localhost") -> list[Gpu]:
    """The machine's NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

    The only NVML code in gpuslice. Raises whatever NVML raises when there is no
    driver or no GPU; ``detect`` turns that into simulated GPUs.
    """
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    node,
                    index,
                    _text(name),
                    int(memory.total),
                    uuid=_text(uuid),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def detect(simulate: str, nvml: Any | None = None, node: str = "localhost") -> tuple[list[Gpu], str]:
    """Real GPUs when NVML finds any, else simulated ones; also says which and why."""
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            return simulated_gpus(simulate, node), "simulated (nvidia-ml-py is not installed)"
    try:
        found = nvml_gpus(nvml, node)
    except Exception as exc:  # NVML raises its own NVMLError subclasses, and OSError without a driver
        return simulated_gpus(simulate, node), f"simulated (NVML: {exc})"
    if not found:
        return simulated_gpus(simulate, node), "simulated (NVML found no GPU)"
    return found, "NVML"


@dataclass(frozen=True)
class GpuSample:
    """One card's readings at one moment, in the units dcgm-exporter reports."""

    index: int
    uuid: str
    model: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float
    power_w: float
    last_xid: int = 0  # the last Xid error code seen (0: none), as DCGM_FI_DEV_XID_ERRORS
    ecc_dbe_total: int = 0  # volatile double-bit ECC errors
    ecc_sbe_total: int = 0  # volatile single-bit (corrected) ECC errors: their rate's trend is an anomaly model's
    processes: tuple[tuple[int, int], ...] = ()  # (pid, GPU memory bytes)
    # (pid, highest SM utilization %) over NVML's samples since the reader's last look; read only
    # when asked (the reclaimer), empty where NVML has no per-process samples (older cards, MIG).
    process_sm_pct: tuple[tuple[int, int], ...] = ()
    simulated: bool = False
    # Every other DCGM field the card answered, by dcgm-exporter's name, in its unit.
    # A field the card or driver does not support is absent (dcgm-exporter skips it too).
    fields: Mapping[str, float] = field(default_factory=dict)
    driver_version: str = ""  # DCGM_FI_DRIVER_VERSION, a label on every series
    pci_bus_id: str = ""


MiB = 1024 * 1024

# GPM (Hopper and newer) metric ids -> (DCGM profiling field, factor to DCGM's unit).
# GPM gives percentages where DCGM gives ratios, and MiB/s where DCGM gives bytes/s.
GPM_FIELDS: dict[str, tuple[str, float]] = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01),
    "NVML_GPM_METRIC_SM_UTIL": ("DCGM_FI_PROF_SM_ACTIVE", 0.01),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("DCGM_FI_PROF_SM_OCCUPANCY", 0.01),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("DCGM_FI_PROF_DRAM_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP64_UTIL": ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP32_UTIL": ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP16_UTIL": ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.01),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("DCGM_FI_PROF_PCIE_TX_BYTES", MiB),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("DCGM_FI_PROF_PCIE_RX_BYTES", MiB),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": ("DCGM_FI_PROF_NVLINK_TX_BYTES", MiB),
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": ("DCGM_FI_PROF_NVLINK_RX_BYTES", MiB),
}

# NVML field values (nvmlDeviceGetFieldValues) -> DCGM field.
NVML_FIELD_VALUES = {
    "NVML_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
}
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_values(nvml: Any, handle: object) -> dict[str, float]:
    ids = [getattr(nvml, name) for name in NVML_FIELD_VALUES]
    values = nvml.nvmlDeviceGetFieldValues(handle, ids)
    found = {}
    for name, value in zip(NVML_FIELD_VALUES.values(), values, strict=True):
        if value.nvmlReturn == nvml.NVML_SUCCESS:  # each field answers for itself
            found[name] = float(getattr(value.value, _VALUE_MEMBER[int(value.valueType)]))
    return found


def _volatile_ecc(nvml: Any, handle: object, error_type: int) -> int:
    """ECC errors of one type since the driver loaded; 0 on a card without ECC (as dcgm-exporter)."""
    try:
        return int(nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, nvml.NVML_VOLATILE_ECC))
    except nvml.NVMLError:
        return 0


def _device_fields(nvml: Any, handle: object) -> dict[str, float]:
    """dcgm-exporter's default DEV fields, each from one NVML call; a call the card or
    driver does not support (any NVMLError) leaves its fields out."""
    readers: list[tuple[tuple[str, ...], Callable[[], Sequence[float]]]] = [
        (("DCGM_FI_DEV_SM_CLOCK",), lambda: [nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)]),
        (("DCGM_FI_DEV_MEM_CLOCK",), lambda: [nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)]),
        (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), lambda: [nvml.nvmlDeviceGetTotalEnergyConsumption(handle)]),
        (("DCGM_FI_DEV_MEM_COPY_UTIL",), lambda: [nvml.nvmlDeviceGetUtilizationRates(handle).memory]),
        (("DCGM_FI_DEV_ENC_UTIL",), lambda: nvml.nvmlDeviceGetEncoderUtilization(handle)[:1]),
        (("DCGM_FI_DEV_DEC_UTIL",), lambda: nvml.nvmlDeviceGetDecoderUtilization(handle)[:1]),
        (
            ("DCGM_FI_DEV_FB_RESERVED",),
            lambda: [nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2).reserved / MiB],
        ),
        (
            (
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "",  # rows pending remapping: not a DCGM default field
                "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            ),
            lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        ),
    ]
    fields: dict[str, float] = {}
    for names, read in readers:
        try:
            values = read()
        except nvml.NVMLError:
            continue
        fields.update((name, float(v)) for name, v in zip(names, values, strict=True) if name)
    with contextlib.suppress(nvml.NVMLError):
        fields.update(_field_values(nvml, handle))
    return fields


class GpmSampler:
    """DCGM's profiling fields from NVML's GPM API (Hopper and newer).

    GPM metrics are computed between two samples, so each scrape takes a sample and
    compares it with the previous scrape's: the first scrape of a card has none.
    Cards without GPM support, and metrics a card does not answer, are left out.
    """

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.unsupported: set[int] = set()

    def read(self, nvml: Any, index: int, handle: object) -> dict[str, float]:
        if index in self.unsupported or not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return {}
        try:
            if index not in self.previous and not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.unsupported.add(index)
                return {}
            sample = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:  # a driver older than GPM, or a card without it
            self.unsupported.add(index)
            return {}
        try:
            nvml.nvmlGpmSampleGet(handle, sample)
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(sample)
            return {}
        previous, self.previous[index] = self.previous.get(index), sample
        if previous is None:
            return {}
        try:
            return self._metrics(nvml, previous, sample)
        finally:
            nvml.nvmlGpmSampleFree(previous)

    @staticmethod
    def _metrics(nvml: Any, first: object, second: object) -> dict[str, float]:
        wanted = [(getattr(nvml, gpm), dcgm, factor) for gpm, (dcgm, factor) in GPM_FIELDS.items()]
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1, request.sample2 = first, second
        for slot, (metric_id, _, _) in enumerate(wanted):
            request.metrics[slot].metricId = metric_id
        try:
            answer = nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError:
            return {}
        return {
            dcgm: float(answer.metrics[slot].value) * factor
            for slot, (_, dcgm, factor) in enumerate(wanted)
            if answer.metrics[slot].nvmlReturn == nvml.NVML_SUCCESS
        }


def process_sm_utilization(nvml: Any, handle: object, since_us: int) -> tuple[tuple[int, int], ...]:
    """Each process's highest SM utilization (%) in NVML's samples newer than ``since_us`` (a CPU
    timestamp in microseconds), from ``nvmlDeviceGetProcessUtilization``. NVML answers "not found"
    when no process ran a kernel since then, and "not supported" on cards without per-process
    accounting: both read as no samples, which says no process was busy (the card-wide
    utilization still speaks for the rest)."""
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except nvml.NVMLError:
        return ()
    highest: dict[int, int] = {}
    for sample in samples:
        pid = int(sample.pid)
        highest[pid] = max(highest.get(pid, 0), int(sample.smUtil))
    return tuple(sorted(highest.items()))


def nvml_samples(
    nvml: Any,
    xids: dict[int, int] | None = None,
    gpm: GpmSampler | None = None,
    process_utilization_since_us: int | None = None,
) -> list[GpuSample]:
    """Read every card through NVML. ``xids`` carries the last Xid per card, which
    NVML reports only as events (``watch_xids`` fills it in the exporter); ``gpm``
    keeps the previous GPM sample of each card between scrapes; with
    ``process_utilization_since_us`` each process's SM utilization since then is read too."""
    nvml.nvmlInit()
    try:
        samples = []
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
            ecc = _volatile_ecc(nvml, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
            ecc_corrected = _volatile_ecc(nvml, handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
            processes = tuple(
                (int(p.pid), int(p.usedGpuMemory or 0)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
            fields = _device_fields(nvml, handle)
            since = process_utilization_since_us
            process_sm = () if since is None else process_sm_utilization(nvml, handle, since)
            if gpm is not None:
                fields.update(gpm.read(nvml, index, handle))
            samples.append(
                GpuSample(
                    index=index,
                    uuid=_text(uuid),
                    model=_text(name),
                    utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                    power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML reports milliwatts
                    last_xid=(xids or {}).get(index, 0),
                    ecc_dbe_total=ecc,
                    ecc_sbe_total=ecc_corrected,
                    processes=processes,
                    process_sm_pct=process_sm,
                    fields=fields,
                    driver_version=driver,
                    pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                )
            )
        return samples
    finally:
        nvml.nvmlShutdown()


def watch_xids(nvml: Any, xids: dict[int, int], stop: threading.Event, wait_ms: int = 1000) -> None:
    """Record the last Xid of each card from NVML's critical-error events until ``stop``.

    NVML reports Xids only as events, so the exporter runs this in a thread and its
    scrapes read ``xids``. Cards that cannot deliver events are skipped.
    """
    nvml.nvmlInit()
    try:
        events = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError:
                continue
        while not stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(events, wait_ms)
            except nvml.NVMLError_Timeout:
                continue
            if data.eventType == nvml.nvmlEventTypeXidCriticalError:
                xids[int(nvml.nvmlDeviceGetIndex(data.device))] = int(data.eventData)
        nvml.nvmlEventSetFree(events)
    finally:
        nvml.nvmlShutdown()


@dataclass(frozen=True)
class Machine:
    """This machine's GPUs, detected once per hub process."""

    gpus: tuple[Gpu, ...]
    source: str  # "NVML" or "simulated (...)"

    @property
    def simulated(self) -> bool:
        return self.source.startswith("simulated")


_MACHINES: dict[str, Machine] = {}


def machine(simulate: str) -> Machine:
    if simulate not in _MACHINES:
        gpus, source = detect(simulate)
        _MACHINES[simulate] = Machine(tuple(gpus), source)
    return _MACHINES[simulate]
