"""The exporter against recorded NVML answers and the simulated source."""

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from prometheus_client import generate_latest

from hub.exporter import GpuCollector, Owner, SimulatedSource, owner_from_proc, registry_for
from spawner.gpus import GpuSample, nvml_samples, simulated_gpus
from spawner.ledger import Held

GiB = 2**30
MiB = 2**20
LABELS = {
    "gpu": "0",
    "UUID": "GPU-5c8b",
    "pci_bus_id": "00000000:00:1E.0",
    "device": "nvidia0",
    "modelName": "Tesla T4",
    "Hostname": "n1",
    "DCGM_FI_DRIVER_VERSION": "550.54.15",
}


class RecordedNvml:
    """Answers recorded from nvidia-ml-py on a T4 (driver 550), replayed with NVML's signatures."""

    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED = 0, 3
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_PCIE_REPLAY_COUNTER, NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL = 82, 94, 66
    nvmlMemory_v2 = 0x02000028  # noqa: N815 - NVML's name

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - NVML's name
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

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> SimpleNamespace:  # noqa: N802
        if version == self.nvmlMemory_v2:
            return SimpleNamespace(
                version=version, total=15843721216, reserved=264634368, free=11645222912, used=3933863936
            )
        return SimpleNamespace(total=15843721216, used=4198498304, free=11645222912)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "550.54.15"

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=b"00000000:00:1E.0")

    def nvmlDeviceGetClockInfo(self, handle: object, clock: int) -> int:  # noqa: N802
        return {self.NVML_CLOCK_SM: 1590, self.NVML_CLOCK_MEM: 5000}[clock]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:  # noqa: N802
        return 8123456789  # mJ

    def nvmlDeviceGetEncoderUtilization(self, handle: object) -> list[int]:  # noqa: N802
        return [0, 167000]  # [utilization %, sampling period us]

    def nvmlDeviceGetDecoderUtilization(self, handle: object) -> list[int]:  # noqa: N802
        return [3, 167000]

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:  # noqa: N802
        raise self.NVMLError_NotSupported()  # Turing has no row remapping (Ampere and newer)

    def nvmlDeviceGetFieldValues(self, handle: object, ids: list[int]) -> list[SimpleNamespace]:  # noqa: N802
        # The T4 answers the PCIe replay counter; memory temperature and NVLink are not supported.
        answers = {94: (self.NVML_SUCCESS, 3, SimpleNamespace(ullVal=2))}
        missing = (self.NVML_ERROR_NOT_SUPPORTED, 0, SimpleNamespace(dVal=0.0))
        return [
            SimpleNamespace(fieldId=i, nvmlReturn=r, valueType=t, value=v)
            for i, (r, t, v) in ((i, answers.get(i, missing)) for i in ids)
        ]

    def nvmlGpmQueryDeviceSupport(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(version=1, isSupportedDevice=0)  # GPM is Hopper and newer

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


class EccCountingNvml(RecordedNvml):
    """A card that has corrected 12 errors and seen 1 it could not correct (volatile counts)."""

    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int) -> int:  # noqa: N802
        assert counter == self.NVML_VOLATILE_ECC
        return {self.NVML_MEMORY_ERROR_TYPE_CORRECTED: 12, self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 1}[kind]


def test_corrected_and_uncorrected_ecc_errors_are_their_own_counters() -> None:
    registry = registry_for(GpuCollector(lambda: nvml_samples(EccCountingNvml()), "nvml", "n1"))
    assert sample_value(registry, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", LABELS) == 12
    assert sample_value(registry, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", LABELS) == 1


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
    assert sample_value(registry, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", LABELS) == 0
    assert sample_value(registry, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", LABELS) == 0
    assert sample_value(registry, "DCGM_FI_DEV_SM_CLOCK", LABELS) == 1590
    assert sample_value(registry, "DCGM_FI_DEV_MEM_CLOCK", LABELS) == 5000
    assert sample_value(registry, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", LABELS) == 8123456789
    assert sample_value(registry, "DCGM_FI_DEV_MEM_COPY_UTIL", LABELS) == 12
    assert sample_value(registry, "DCGM_FI_DEV_DEC_UTIL", LABELS) == 3
    assert sample_value(registry, "DCGM_FI_DEV_FB_RESERVED", LABELS) == 264634368 / MiB
    assert sample_value(registry, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", LABELS) == 2
    # What the T4 does not support is left out, not reported as 0.
    for unsupported in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert sample_value(registry, unsupported, LABELS) is None
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


class RecordedHopperNvml(RecordedNvml):
    """An H100's GPM answers (nvidia-ml-py's real ctypes request structure, filled as NVML fills it)."""

    GPM: ClassVar[dict[int, float]] = {
        1: 62.0,
        2: 55.5,
        3: 31.0,
        5: 40.25,
        10: 47.0,
        11: 0.5,
        12: 20.0,
        13: 12.0,
        20: 1024.0,
        21: 2048.0,
    }

    def __init__(self) -> None:
        super().__init__()
        import pynvml

        self.pynvml, self.samples_taken, self.freed = pynvml, 0, 0
        for name in dir(pynvml):
            if name.startswith("NVML_GPM_") or name == "c_nvmlGpmMetricsGet_t":
                setattr(self, name, getattr(pynvml, name))

    def nvmlGpmQueryDeviceSupport(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(version=1, isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> object:  # noqa: N802
        return self.pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, handle: object, sample: object) -> object:  # noqa: N802
        self.samples_taken += 1
        return sample

    def nvmlGpmSampleFree(self, sample: object) -> None:  # noqa: N802
        self.freed += 1

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # noqa: N802
        assert request.version == self.NVML_GPM_METRICS_GET_VERSION
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in self.GPM:
                metric.nvmlReturn, metric.value = self.NVML_SUCCESS, self.GPM[metric.metricId]
            else:  # NVLink on a PCIe card
                metric.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
        return request


def test_hopper_profiling_fields_come_from_gpm_between_two_scrapes() -> None:
    from spawner.gpus import GpmSampler

    nvml, gpm = RecordedHopperNvml(), GpmSampler()
    assert nvml_samples(nvml, gpm=gpm)[0].fields.keys().isdisjoint({"DCGM_FI_PROF_SM_ACTIVE"})  # one sample: no rate
    fields = nvml_samples(nvml, gpm=gpm)[0].fields
    assert fields["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.62  # GPM's percent is DCGM's ratio
    assert fields["DCGM_FI_PROF_SM_ACTIVE"] == 0.555 and fields["DCGM_FI_PROF_SM_OCCUPANCY"] == 0.31
    assert fields["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.4025 and fields["DCGM_FI_PROF_DRAM_ACTIVE"] == pytest.approx(
        0.47
    )
    assert fields["DCGM_FI_PROF_PIPE_FP64_ACTIVE"] == 0.005 and fields["DCGM_FI_PROF_PIPE_FP16_ACTIVE"] == 0.12
    assert fields["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1024 * MiB  # GPM's MiB/s is DCGM's bytes/s
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" not in fields
    assert (nvml.samples_taken, nvml.freed) == (2, 1)  # the newest sample is kept for the next scrape


def test_counters_are_exposed_without_a_total_suffix_as_dcgm_exporter_writes_them() -> None:
    from hub.exporter import exposition

    text = exposition(registry_for(GpuCollector(lambda: nvml_samples(RecordedNvml()), "nvml", "n1"))).decode()
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n" in text
    assert '\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-5c8b",pci_bus_id=' in text
    assert "_total" not in text.replace("VOL_TOTAL", "").replace("BANDWIDTH_TOTAL", "")
    assert "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n" in text


def test_the_simulated_source_serves_every_dcgm_field() -> None:
    from hub.exporter import DCGM_FIELDS

    holds = [Held("alice/", 0, "alice", "", 4 * GiB, pid=11)]
    now = [0.0]
    source = SimulatedSource(simulated_gpus("1x80GiB:H100,1x16GiB:T4"), lambda: holds, clock=lambda: now[0])
    registry = registry_for(GpuCollector(source, "simulated", "n1", lambda p: None))
    names = {m.name for m in registry.collect()}
    assert {f.name for f in DCGM_FIELDS} <= names
    first = {s.name: s.value for m in registry.collect() for s in m.samples if s.labels.get("gpu") == "0"}
    now[0] = 60.0
    later = {s.name: s.value for m in registry.collect() for s in m.samples if s.labels.get("gpu") == "0"}
    assert later["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] > first["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert later["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] > 0 and later["DCGM_FI_DEV_SM_CLOCK"] > 1000
    idle = {s.name: s.value for m in registry.collect() for s in m.samples if s.labels.get("gpu") == "1"}
    assert idle["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0 and idle["DCGM_FI_DEV_SM_CLOCK"] < later["DCGM_FI_DEV_SM_CLOCK"]


def test_docs_list_every_dcgm_field_served() -> None:
    from hub.exporter import DCGM_FIELDS

    docs = (Path(__file__).parents[2] / "docs" / "monitoring.md").read_text()
    listed = {line.split("`")[1] for line in docs.splitlines() if line.startswith("| `DCGM_FI_")}
    assert listed == {f.name for f in DCGM_FIELDS}


@pytest.mark.process
def test_with_a_password_file_the_exporter_asks_for_it(tmp_path: Path) -> None:
    """Its per-process series say whose process uses which GPU: on one machine, students may not read them."""
    import subprocess
    import sys

    import requests

    from spawner.ports import free_port

    password = tmp_path / "web-password"
    password.write_text("monitoring-secret\n")
    port = free_port()
    gpuslice = str(Path(sys.executable).with_name("gpuslice"))
    command = [gpuslice, "exporter", "--port", str(port), "--simulate", "1x16GiB:T4", "--password-file", str(password)]
    exporter = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert exporter.stdout is not None and "GPUs on" in exporter.stdout.readline()
        url = f"http://127.0.0.1:{port}/metrics"
        _wait_listening(port)
        for auth in (None, ("gpuslice", "a-guess"), ("admin", "monitoring-secret")):
            assert requests.get(url, auth=auth, timeout=10).status_code == 401, auth
        answer = requests.get(url, auth=("gpuslice", "monitoring-secret"), timeout=10)
        assert answer.status_code == 200 and "DCGM_FI_DEV_FB_USED" in answer.text
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)


def _wait_listening(port: int) -> None:
    import socket
    import time

    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")
