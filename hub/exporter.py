"""`gpuslice exporter`: GPU metrics with dcgm-exporter's names, plus per-process attribution.

A prometheus_client custom collector whose families are built fresh on every scrape
from a *source*: NVML on a machine with NVIDIA GPUs, or simulated GPUs that follow
the slices in the hub's ledger. A failing source drops its families for that scrape
(and reports ``gpuslice_exporter_source_up 0``), never the scrape itself.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from spawner import environ
from spawner.gpus import GpuSample
from spawner.inventory import Gpu
from spawner.ledger import Held, Ledger

MiB = 1024 * 1024
# Power at idle and at full load, per model, for believable simulated readings.
POWER_W = {"T4": (10.0, 70.0), "H100": (70.0, 700.0), "A100": (50.0, 400.0), "V100": (30.0, 300.0)}


@dataclass(frozen=True)
class Owner:
    user: str
    server: str


def owner_from_proc(pid: int, proc: Path = Path("/proc")) -> Owner | None:
    """The notebook server a process belongs to, from the environment it inherited."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    user = env.get(b"JUPYTERHUB_USER")
    if user is None:
        return None
    return Owner(user.decode(), env.get(b"JUPYTERHUB_SERVER_NAME", b"").decode())


Source = Callable[[], Sequence[GpuSample]]
OwnerOf = Callable[[int], Owner | None]


class GpuCollector(Collector):
    def __init__(self, source: Source, source_name: str, hostname: str, owner_of: OwnerOf = owner_from_proc) -> None:
        self.source, self.source_name, self.hostname, self.owner_of = source, source_name, hostname, owner_of

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        up = GaugeMetricFamily(
            "gpuslice_exporter_source_up", "1 if the GPU source answered this scrape.", labels=["source"]
        )
        try:
            samples = list(self.source())
        except Exception:
            samples = None
        up.add_metric([self.source_name], 0.0 if samples is None else 1.0)
        if samples is not None:
            yield from self._families(samples)
        yield up
        duration = GaugeMetricFamily(
            "gpuslice_exporter_scrape_duration_seconds", "Time to read the GPU source and build this scrape."
        )
        duration.add_metric([], time.perf_counter() - started)
        yield duration

    def _families(self, samples: list[GpuSample]) -> Iterable[Metric]:
        labels = ["gpu", "UUID", "device", "modelName", "Hostname"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        util = gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
        used = gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
        free = gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
        temp = gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
        power = gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
        xid = gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
        ecc = CounterMetricFamily(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", labels=labels
        )
        simulated = gauge("gpuslice_gpu_simulated", "1 for a simulated GPU.")
        process = GaugeMetricFamily(
            "gpuslice_process_gpu_memory_bytes",
            "GPU memory used by one process, with the notebook server it belongs to.",
            labels=["gpu", "Hostname", "user", "server", "pid"],
        )
        for s in samples:
            values = [str(s.index), s.uuid, f"nvidia{s.index}", s.model, self.hostname]
            util.add_metric(values, s.utilization_pct)
            used.add_metric(values, s.memory_used_bytes / MiB)
            free.add_metric(values, max(0, s.memory_total_bytes - s.memory_used_bytes) / MiB)
            temp.add_metric(values, s.temperature_c)
            power.add_metric(values, s.power_w)
            xid.add_metric(values, float(s.last_xid))
            ecc.add_metric(values, float(s.ecc_dbe_total))
            simulated.add_metric(values, 1.0 if s.simulated else 0.0)
            for pid, memory in s.processes:
                owner = self.owner_of(pid)
                process.add_metric(
                    [str(s.index), self.hostname, owner.user if owner else "", owner.server if owner else "", str(pid)],
                    float(memory),
                )
        yield from (util, used, free, temp, power, xid, ecc, simulated, process)


class SimulatedSource:
    """Believable readings for simulated GPUs: memory and utilization follow the
    ledger's slices; a faults file (JSON) injects Xid, ECC, heat and over-use."""

    def __init__(
        self,
        gpus: Sequence[Gpu],
        holds: Callable[[], Iterable[Held]],
        faults: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gpus, self.holds, self.faults, self.clock = list(gpus), holds, faults, clock
        self.ecc: dict[int, int] = {}

    def _faults(self) -> list[dict[str, object]]:
        if self.faults is None or not self.faults.exists():
            return []
        loaded = json.loads(self.faults.read_text() or "[]")
        return [f for f in loaded if isinstance(f, dict)]

    def __call__(self) -> list[GpuSample]:
        holds = list(self.holds())
        faults = self._faults()
        now = self.clock()
        samples = []
        for gpu in self.gpus:
            mine = [h for h in holds if h.gpu_index == gpu.index]
            # Each server uses a steady share of its slice (30..90%), drifting slowly.
            processes = []
            for h in mine:
                phase = (zlib.crc32(h.key.encode()) % 1000) / 1000 * 2 * math.pi
                share = 0.6 + 0.3 * math.sin(now / 300 + phase)
                processes.append((h.pid or 0, int(h.memory_bytes * share)))
            for fault in faults:
                if fault.get("gpu") == gpu.index and "over_slice" in fault:
                    key = str(fault["over_slice"])
                    processes = [
                        (pid, int(held.memory_bytes * 1.5)) if held.key == key else (pid, m)
                        for (pid, m), held in zip(processes, mine, strict=True)
                    ]
            used = min(gpu.memory_bytes, sum(m for _, m in processes))
            utilization = min(100.0, 35.0 * len(mine) * (0.8 + 0.2 * math.sin(now / 60 + gpu.index)))
            idle, peak = next((p for m, p in POWER_W.items() if m in gpu.model), (20.0, 250.0))
            sample = GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                utilization_pct=round(utilization, 1),
                memory_used_bytes=used,
                memory_total_bytes=gpu.memory_bytes,
                temperature_c=round(32 + 0.45 * utilization, 1),
                power_w=round(idle + (peak - idle) * utilization / 100, 1),
                processes=tuple((pid, m) for pid, m in processes if pid),
                simulated=True,
            )
            samples.append(_inject(sample, [f for f in faults if f.get("gpu") == gpu.index], self.ecc))
        return samples


def _inject(sample: GpuSample, faults: list[dict[str, object]], ecc: dict[int, int]) -> GpuSample:
    for fault in faults:
        if "xid" in fault:
            sample = replace(sample, last_xid=int(str(fault["xid"])))
        if "temperature" in fault:
            sample = replace(sample, temperature_c=float(str(fault["temperature"])))
        if "ecc_dbe" in fault:
            ecc[sample.index] = max(ecc.get(sample.index, 0), int(str(fault["ecc_dbe"])))
    return replace(sample, ecc_dbe_total=ecc.get(sample.index, 0))


def source_for(simulate: str | None, ledger: Path | None, faults: Path | None) -> tuple[Source, str]:
    """NVML when it finds GPUs; otherwise simulated GPUs from ``simulate`` following ``ledger``."""
    from hub.settings import DEFAULT_SIMULATE
    from spawner.gpus import detect, nvml_samples

    gpus, found = detect(simulate or DEFAULT_SIMULATE)
    if found == "NVML":
        import threading

        import pynvml

        from spawner.gpus import watch_xids

        xids: dict[int, int] = {}
        threading.Thread(target=watch_xids, args=(pynvml, xids, threading.Event()), daemon=True).start()
        return (lambda: nvml_samples(pynvml, xids)), "nvml"
    holds: Callable[[], Iterable[Held]] = (lambda: Ledger(ledger).holdings()) if ledger else (lambda: [])
    return SimulatedSource(gpus, holds, faults), "simulated"


def registry_for(collector: GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def default_hostname() -> str:
    """The node name shared with the hub's metrics ("localhost" on a single machine)."""
    return environ.NODE_NAME.get() or "localhost"


def serve(registry: CollectorRegistry, port: int, address: str = "127.0.0.1") -> None:
    """Serve /metrics until SIGTERM or SIGINT."""
    import signal
    import threading

    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=address, registry=registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
