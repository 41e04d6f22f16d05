"""`gpuslice exporter`: GPU metrics with dcgm-exporter's names, plus per-process attribution.

A prometheus_client custom collector whose families are built fresh on every scrape
from a *source*: NVML on a machine with NVIDIA GPUs, or simulated GPUs that follow
the slices in the hub's ledger. A failing source drops its families for that scrape
(and reports ``gpuslice_exporter_source_up 0``), never the scrape itself.
"""

from __future__ import annotations

import base64
import hmac
import json
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hub.settings import MONITORING_USER
from spawner import environ
from spawner.gpus import GpuSample
from spawner.inventory import Gpu
from spawner.jobs import job_server
from spawner.ledger import Held, Ledger

MiB = 1024 * 1024
# Power at idle and at full load, per model, for believable simulated readings.
POWER_W = {"T4": (10.0, 70.0), "H100": (70.0, 700.0), "A100": (50.0, 400.0), "V100": (30.0, 300.0)}
# Highest SM and memory clocks (MHz) per model; idle cards clock down to IDLE_CLOCKS_MHZ.
CLOCKS_MHZ = {"T4": (1590.0, 5001.0), "H100": (1980.0, 2619.0), "A100": (1410.0, 1593.0), "V100": (1530.0, 877.0)}
IDLE_CLOCKS_MHZ = (210.0, 405.0)
NVLINK_MODELS = ("H100", "A100", "V100")


@dataclass(frozen=True)
class Owner:
    user: str
    server: str


def owner_from_proc(pid: int, proc: Path = Path("/proc")) -> Owner | None:
    """The notebook server (or batch job) a process belongs to, from the environment it inherited."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    job_user, job_id = env.get(environ.JOB_USER.name.encode()), env.get(environ.JOB_ID.name.encode())
    if job_user is not None and job_id is not None:  # a batch job's process: named as the ledger names it
        return Owner(job_user.decode(), job_server(int(job_id)))
    user = env.get(b"JUPYTERHUB_USER")
    if user is None:
        return None
    return Owner(user.decode(), env.get(b"JUPYTERHUB_SERVER_NAME", b"").decode())


Source = Callable[[], Sequence[GpuSample]]
OwnerOf = Callable[[int], Owner | None]


@dataclass(frozen=True)
class DcgmField:
    name: str
    type: str  # "gauge" or "counter", as dcgm-exporter's counters CSV says
    help: str


# dcgm-exporter's default counters (etc/default-counters.csv), with its types and help
# texts, then the ECC counters our alert and anomaly model use and the profiling fields NVML's GPM API
# gives on Hopper and newer (etc/dcp-metrics-included.csv). Names are written exactly as
# dcgm-exporter writes them: a counter has no "_total" suffix.
DCGM_FIELDS = tuple(
    DcgmField(*row)
    for row in [
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
        (
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "counter",
            "Total number of NVLink bandwidth counters for all lanes.",
        ),
        ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
        ),
        ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
        ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
        ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
        (
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "gauge",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
            " - in bytes per second.",
        ),
        (
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "gauge",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
            " - in bytes per second.",
        ),
        (
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "gauge",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        ),
        (
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "gauge",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        ),
    ]
)
# dcgm-exporter's labels on every GPU series; DCGM_FI_DRIVER_VERSION is its one default
# "label" field. It writes the host as "Hostname" in its 2.x/3.x releases (newer ones
# write "hostname"); the rules, portal and dashboards here use "Hostname".
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


def _core_fields(s: GpuSample) -> dict[str, float]:
    return {
        "DCGM_FI_DEV_GPU_UTIL": s.utilization_pct,
        "DCGM_FI_DEV_FB_USED": s.memory_used_bytes / MiB,
        "DCGM_FI_DEV_FB_FREE": max(0, s.memory_total_bytes - s.memory_used_bytes) / MiB,
        "DCGM_FI_DEV_GPU_TEMP": s.temperature_c,
        "DCGM_FI_DEV_POWER_USAGE": s.power_w,
        "DCGM_FI_DEV_XID_ERRORS": float(s.last_xid),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": float(s.ecc_sbe_total),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": float(s.ecc_dbe_total),
    }


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
            yield from self._dcgm_families(samples)
            yield from self._own_families(samples)
        yield up
        duration = GaugeMetricFamily(
            "gpuslice_exporter_scrape_duration_seconds", "Time to read the GPU source and build this scrape."
        )
        duration.add_metric([], time.perf_counter() - started)
        yield duration

    def _dcgm_families(self, samples: list[GpuSample]) -> Iterable[Metric]:
        """One family per DCGM field some card answered; a card that does not support
        a field has no series in it (as with dcgm-exporter)."""
        readings = [(s, {**s.fields, **_core_fields(s)}) for s in samples]
        for field in DCGM_FIELDS:
            # Metric, not CounterMetricFamily: dcgm-exporter's counters carry no _total suffix.
            family = Metric(field.name, field.help, field.type)
            for s, values in readings:
                if field.name in values:
                    family.add_sample(field.name, self._labels(s), values[field.name])
            if family.samples:
                yield family

    def _labels(self, s: GpuSample) -> dict[str, str]:
        values = [str(s.index), s.uuid, s.pci_bus_id, f"nvidia{s.index}", s.model, self.hostname, s.driver_version]
        return dict(zip(GPU_LABELS, values, strict=True))

    def _own_families(self, samples: list[GpuSample]) -> Iterable[Metric]:
        simulated = GaugeMetricFamily("gpuslice_gpu_simulated", "1 for a simulated GPU.", labels=GPU_LABELS)
        process = GaugeMetricFamily(
            "gpuslice_process_gpu_memory_bytes",
            "GPU memory used by one process, with the notebook server it belongs to.",
            labels=["gpu", "Hostname", "user", "server", "pid"],
        )
        for s in samples:
            simulated.add_metric(list(self._labels(s).values()), 1.0 if s.simulated else 0.0)
            for pid, memory in s.processes:
                owner = self.owner_of(pid)
                process.add_metric(
                    [str(s.index), self.hostname, owner.user if owner else "", owner.server if owner else "", str(pid)],
                    float(memory),
                )
        yield from (simulated, process)


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
        self.energy_mj: dict[int, tuple[float, float]] = {}  # card -> (time, mJ so far)
        self.nvlink: dict[int, float] = {}

    def _fields(self, gpu: Gpu, utilization: float, power_w: float, now: float) -> dict[str, float]:
        """Every other DCGM field, following the card's load (a simulated card supports all)."""
        load = utilization / 100
        top_sm, top_mem = next((c for m, c in CLOCKS_MHZ.items() if m in gpu.model), (1500.0, 1500.0))
        idle_sm, idle_mem = IDLE_CLOCKS_MHZ
        then, energy = self.energy_mj.get(gpu.index, (now, 0.0))
        energy += power_w * 1000 * max(0.0, now - then)  # W x s = J; DCGM counts mJ
        self.energy_mj[gpu.index] = (now, energy)
        nvlink = gpu.model.startswith(NVLINK_MODELS) or any(m in gpu.model for m in NVLINK_MODELS)
        nvlink_rate = 20e9 * load if nvlink else 0.0
        self.nvlink[gpu.index] = self.nvlink.get(gpu.index, 0.0) + nvlink_rate / 1e6  # counters never go back
        return {
            "DCGM_FI_DEV_SM_CLOCK": round(idle_sm + (top_sm - idle_sm) * min(1.0, 4 * load)),
            "DCGM_FI_DEV_MEM_CLOCK": top_mem if load else idle_mem,
            "DCGM_FI_DEV_MEMORY_TEMP": round(34 + 0.5 * utilization, 1),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(energy),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(0.6 * utilization, 1),
            "DCGM_FI_DEV_ENC_UTIL": 0.0,
            "DCGM_FI_DEV_DEC_UTIL": 0.0,
            "DCGM_FI_DEV_FB_RESERVED": round(gpu.memory_bytes * 0.0065 / MiB),
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(self.nvlink[gpu.index]),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0.0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(load, 3),
            "DCGM_FI_PROF_SM_ACTIVE": round(0.9 * load, 3),
            "DCGM_FI_PROF_SM_OCCUPANCY": round(0.5 * load, 3),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(0.35 * load, 3),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(0.45 * load, 3),
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE": round(0.02 * load, 3),
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE": round(0.3 * load, 3),
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE": round(0.15 * load, 3),
            "DCGM_FI_PROF_PCIE_TX_BYTES": round(2e9 * load),
            "DCGM_FI_PROF_PCIE_RX_BYTES": round(3e9 * load),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": round(nvlink_rate),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": round(nvlink_rate),
        }

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
            power = round(idle + (peak - idle) * utilization / 100, 1)
            sample = GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                utilization_pct=round(utilization, 1),
                memory_used_bytes=used,
                memory_total_bytes=gpu.memory_bytes,
                temperature_c=round(32 + 0.45 * utilization, 1),
                power_w=power,
                processes=tuple((pid, m) for pid, m in processes if pid),
                simulated=True,
                fields=self._fields(gpu, utilization, power, now),
                driver_version="simulated",
                pci_bus_id=f"00000000:{gpu.index + 1:02X}:00.0",
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
    from spawner.gpus import GpmSampler, detect, nvml_samples

    gpus, found = detect(simulate or DEFAULT_SIMULATE)
    if found == "NVML":
        import threading

        import pynvml

        from spawner.gpus import watch_xids

        xids: dict[int, int] = {}
        threading.Thread(target=watch_xids, args=(pynvml, xids, threading.Event()), daemon=True).start()
        gpm = GpmSampler()
        return (lambda: nvml_samples(pynvml, xids, gpm)), "nvml"
    holds: Callable[[], Iterable[Held]] = (lambda: Ledger(ledger).holdings()) if ledger else (lambda: [])
    return SimulatedSource(gpus, holds, faults), "simulated"


def registry_for(collector: GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def default_hostname() -> str:
    """The node name shared with the hub's metrics ("localhost" on a single machine)."""
    return environ.read().get(environ.NODE_NAME) or "localhost"


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format (0.0.4) exactly as dcgm-exporter writes it: ``# HELP``/``# TYPE``
    carry each family's own name, so a counter is typed ``counter`` without a ``_total``
    suffix (prometheus_client's writer would name the type line ``..._total``)."""
    lines = []
    for family in registry.collect():
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {family.name} {doc}", f"# TYPE {family.name} {family.type}"]
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            lines.append(
                f"{sample.name}{{{labels}}} {_number(sample.value)}"
                if labels
                else f"{sample.name} {_number(sample.value)}"
            )
    return ("\n".join(lines) + "\n").encode()


def _number(value: float) -> str:
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def allowed(authorization: object, password: str | None) -> bool:
    """Whether an Authorization header carries the monitoring user's password (always, without one)."""
    if password is None:
        return True
    expected = "Basic " + base64.b64encode(f"{MONITORING_USER}:{password}".encode()).decode()
    return isinstance(authorization, str) and hmac.compare_digest(authorization.encode(), expected.encode())


def serve(registry: CollectorRegistry, port: int, address: str = "127.0.0.1", password: str | None = None) -> None:
    """Serve /metrics until SIGTERM or SIGINT, always in the text format dcgm-exporter serves.

    ``password``: ask for basic auth (user ``gpuslice``), as Prometheus and Alertmanager do on one
    machine: the per-process series say who runs what, which students may not read."""
    import signal
    import threading
    from wsgiref.simple_server import make_server

    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        if not allowed(environ.get("HTTP_AUTHORIZATION"), password):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="gpuslice"')])
            return [b"Unauthorized\n"]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b""]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [exposition(registry)]

    server = make_server(address, port, app, ThreadingWSGIServer, handler_class=_SilentHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
