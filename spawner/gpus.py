"""The machine's GPUs: from NVML when it finds any, else simulated from a spec.

GPU spec, as in settings (`gpus.simulate`) and `--simulate`: comma-separated
``COUNTxSIZE[:MODEL]``, for example ``2x16GiB:T4,1x80GiB:H100``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from spawner.inventory import Gpu
from spawner.shares import ShareError, format_bytes, parse_quantity

_ENTRY = re.compile(r"^\s*(?P<count>[0-9]+)\s*[xX]\s*(?P<size>[^:]+?)\s*(?::\s*(?P<model>[^,]*?))?\s*$")
SPEC_EXAMPLE = "2x16GiB:T4,1x80GiB:H100"


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
    processes: tuple[tuple[int, int], ...] = ()  # (pid, GPU memory bytes)
    simulated: bool = False


def nvml_samples(nvml: Any, xids: dict[int, int] | None = None) -> list[GpuSample]:
    """Read every card through NVML. ``xids`` carries the last Xid per card, which
    NVML reports only as events (``watch_xids`` fills it in the exporter)."""
    nvml.nvmlInit()
    try:
        samples = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
            try:
                ecc = int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                )
            except nvml.NVMLError:  # cards without ECC
                ecc = 0
            processes = tuple(
                (int(p.pid), int(p.usedGpuMemory or 0)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
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
                    processes=processes,
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
