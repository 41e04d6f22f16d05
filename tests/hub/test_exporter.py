"""The exporter against recorded NVML answers and the simulated source."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest

from hub.exporter import GpuCollector, Owner, SimulatedSource, owner_from_proc, registry_for
from spawner.gpus import GpuSample, nvml_samples, simulated_gpus
from spawner.ledger import Held

GiB = 2**30
MiB = 2**20
LABELS = {"gpu": "0", "UUID": "GPU-5c8b", "device": "nvidia0", "modelName": "Tesla T4", "Hostname": "n1"}


class RecordedNvml:
    """Answers recorded from nvidia-ml-py on a T4 (driver 550), replayed with NVML's signatures."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.calls: list[str] = []

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.calls.append("init")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        return "Tesla T4"

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        return "GPU-5c8b"

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(total=15843721216, used=4198498304, free=11645222912)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:  # noqa: N802
        return 54

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:  # noqa: N802
        return 31250  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=4242, usedGpuMemory=3 * GiB), SimpleNamespace(pid=4343, usedGpuMemory=None)]


def sample_value(registry: object, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[attr-defined, no-any-return]


def test_nvml_readings_become_dcgm_metrics() -> None:
    nvml = RecordedNvml()
    owners = {4242: Owner("alice", "")}
    registry = registry_for(GpuCollector(lambda: nvml_samples(nvml, {0: 79}), "nvml", "n1", owners.get))
    assert sample_value(registry, "DCGM_FI_DEV_GPU_UTIL", LABELS) == 37
    assert sample_value(registry, "DCGM_FI_DEV_FB_USED", LABELS) == 4198498304 / MiB
    assert sample_value(registry, "DCGM_FI_DEV_FB_FREE", LABELS) == (15843721216 - 4198498304) / MiB
    assert sample_value(registry, "DCGM_FI_DEV_GPU_TEMP", LABELS) == 54
    assert sample_value(registry, "DCGM_FI_DEV_POWER_USAGE", LABELS) == 31.25
    assert sample_value(registry, "DCGM_FI_DEV_XID_ERRORS", LABELS) == 79
    assert sample_value(registry, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total", LABELS) == 0
    process = {"gpu": "0", "Hostname": "n1", "user": "alice", "server": "", "pid": "4242"}
    assert sample_value(registry, "gpuslice_process_gpu_memory_bytes", process) == 3 * GiB
    unknown = {"gpu": "0", "Hostname": "n1", "user": "", "server": "", "pid": "4343"}
    assert sample_value(registry, "gpuslice_process_gpu_memory_bytes", unknown) == 0
    assert sample_value(registry, "gpuslice_exporter_source_up", {"source": "nvml"}) == 1
    assert nvml.calls[-1] == "shutdown"


def test_a_failing_source_keeps_the_scrape_and_says_so() -> None:
    def broken() -> list[GpuSample]:
        raise OSError("NVML Shared Library Not Found")

    registry = registry_for(GpuCollector(broken, "nvml", "n1"))
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    assert 'gpuslice_exporter_source_up{source="nvml"} 0.0' in text
    assert "DCGM_FI_DEV_GPU_UTIL" not in text
    assert "gpuslice_exporter_scrape_duration_seconds" in text


def test_simulated_gpus_follow_the_ledger_and_injected_faults(tmp_path: Path) -> None:
    holds = [Held("alice/", 0, "alice", "", 4 * GiB, pid=11), Held("bob/", 0, "bob", "", 8 * GiB, pid=12)]
    faults = tmp_path / "faults.json"
    source = SimulatedSource(simulated_gpus("2x16GiB:T4"), lambda: holds, faults, clock=lambda: 0.0)
    busy, idle = source()
    assert busy.simulated and 0 < busy.memory_used_bytes <= 12 * GiB
    assert busy.utilization_pct > idle.utilization_pct == 0
    assert busy.temperature_c > idle.temperature_c and busy.power_w > idle.power_w
    assert {pid for pid, _ in busy.processes} == {11, 12} and idle.processes == ()

    faults.write_text(json.dumps([{"gpu": 1, "xid": 79}, {"gpu": 1, "ecc_dbe": 2}, {"gpu": 0, "over_slice": "alice/"}]))
    busy, idle = source()
    assert idle.last_xid == 79 and idle.ecc_dbe_total == 2 and busy.last_xid == 0
    assert dict(busy.processes)[11] == 6 * GiB  # 1.5 x alice's 4 GiB slice
    faults.write_text("[]")
    assert source()[1].ecc_dbe_total == 2  # a counter never goes back


def test_owner_comes_from_the_process_environment(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "environ").write_bytes(b"HOME=/x\0JUPYTERHUB_USER=alice\0JUPYTERHUB_SERVER_NAME=gpu\0")
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "environ").write_bytes(b"HOME=/y\0")
    assert owner_from_proc(77, tmp_path) == Owner("alice", "gpu")
    assert owner_from_proc(78, tmp_path) is None
    assert owner_from_proc(79, tmp_path) is None


def test_scrape_cost_for_eight_gpus_is_printed() -> None:
    """Benchmark, not a timed test: prints the mean scrape time of 8 simulated GPUs."""
    holds = [Held(f"u{i}/", i % 8, f"u{i}", "", GiB, pid=1000 + i) for i in range(32)]
    registry = registry_for(
        GpuCollector(SimulatedSource(simulated_gpus("8x80GiB:H100"), lambda: holds), "simulated", "n1", lambda p: None)
    )
    generate_latest(registry)  # type: ignore[arg-type]
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        text = generate_latest(registry)  # type: ignore[arg-type]
    per_scrape_ms = (time.perf_counter() - start) / rounds * 1000
    print(f"\nexporter scrape, 8 GPUs, 32 processes: {per_scrape_ms:.2f} ms per scrape (target under 20 ms)")
    assert text.count(b"DCGM_FI_DEV_GPU_UTIL{") == 8


class NvmlEvents(RecordedNvml):
    """NVML's event API: one Xid 79 on card 0, then timeouts."""

    nvmlEventTypeXidCriticalError = 8  # noqa: N815 - NVML's name

    class NVMLError_Timeout(Exception):  # noqa: N801, N818 - NVML's name
        pass

    def __init__(self, stop: object) -> None:
        super().__init__()
        self.stop, self.pending = stop, [SimpleNamespace(eventType=8, eventData=79, device=("handle", 0))]

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: object, types: int, event_set: str) -> None:  # noqa: N802
        self.calls.append(f"register {handle}")

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        if self.pending:
            return self.pending.pop()
        self.stop.set()  # type: ignore[attr-defined]
        raise self.NVMLError_Timeout()

    def nvmlDeviceGetIndex(self, handle: tuple[str, int]) -> int:  # noqa: N802
        return handle[1]

    def nvmlEventSetFree(self, event_set: str) -> None:  # noqa: N802
        self.calls.append("free")


def test_xid_events_are_recorded_per_card() -> None:
    import threading

    from spawner.gpus import watch_xids

    stop = threading.Event()
    nvml = NvmlEvents(stop)
    xids: dict[int, int] = {}
    watch_xids(nvml, xids, stop, wait_ms=1)
    assert xids == {0: 79}
    assert nvml.calls == ["init", "register ('handle', 0)", "free", "shutdown"]
    assert nvml_samples(RecordedNvml(), xids)[0].last_xid == 79
