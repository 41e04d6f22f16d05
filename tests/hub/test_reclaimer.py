"""hub/reclaimer.py's reading of JupyterHub's users and of the GPUs (the service itself runs in
tests/e2e/test_waiting_line.py, and on Kubernetes in tests/kube/test_kube_line.py)."""

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
import requests

from hub.exporter import Owner
from hub.reclaimer import Reclaimer, gpu_evidence, gpu_keys_from_pods, holders_from_hub, process_utilization
from spawner.gpus import GpuSample, nvml_samples
from spawner.ledger import Ledger
from spawner.waitline import Holder, activity_report_interval, stop_at
from tests.hub.test_exporter import RecordedNvml

GiB = 2**30


def test_ready_servers_become_holders_with_their_last_activity() -> None:
    users = [
        {
            "name": "ann",
            "servers": {
                "": {"ready": True, "last_activity": "2026-11-23T07:00:00.000000Z"},
                "big": {"ready": False, "last_activity": "2026-11-23T07:00:00Z"},  # still starting: not a holder
            },
        },
        {"name": "bo", "servers": {"cpu": {"ready": True, "last_activity": None}}},
    ]
    holders = holders_from_hub(users, gpu_keys={"ann/"})
    assert holders == [Holder("ann/", True, 1795417200.0, 1795417200.0), Holder("bo/cpu", False, None, None)]


def card(
    index: int,
    utilization: float,
    processes: tuple[tuple[int, int], ...],
    process_sm_pct: tuple[tuple[int, int], ...] = (),
) -> GpuSample:
    used = sum(m for _, m in processes)
    return GpuSample(
        index,
        f"GPU-{index}",
        "H100",
        utilization,
        used,
        80 * GiB,
        40,
        100,
        processes=processes,
        process_sm_pct=process_sm_pct,
    )


OWNERS = {10: Owner("ann", ""), 11: Owner("ann", ""), 20: Owner("bo", "lab")}


def test_each_servers_gpu_memory_is_the_sum_of_its_processes_and_each_card_names_its_owners() -> None:
    samples = [card(0, 70.0, ((10, 1 * GiB), (11, 2 * GiB))), card(1, 30.0, ((20, GiB), (99, GiB)))]
    memory, cards = gpu_evidence(samples, OWNERS.get, {"ann/", "bo/lab", "cy/"})
    assert memory == {"ann/": 3 * GiB, "bo/lab": GiB, "cy/": 0}
    assert cards == [(70.0, ["ann/", "ann/"]), (30.0, ["bo/lab", "pid 99"])]  # 99: no notebook server's


def test_the_reclaimer_keeps_a_server_whose_gpu_memory_moves_though_jupyterhub_says_it_is_idle(tmp_path: Path) -> None:
    readings = iter([(1 * GiB, 5 * GiB), (1 * GiB, 6 * GiB)])  # bo's memory grows between the looks

    def source() -> list[GpuSample]:
        ann, bo = next(readings)
        return [card(0, 0.0, ((10, ann),)), card(1, 0.0, ((20, bo),))]

    reclaimer = Reclaimer("http://hub", "token", Ledger(tmp_path / "l.sqlite"), 900, 180, source, OWNERS.get)
    users = [
        {"name": "ann", "servers": {"": {"ready": True, "last_activity": "2026-11-23T07:00:00Z"}}},
        {"name": "bo", "servers": {"lab": {"ready": True, "last_activity": "2026-11-23T07:00:00Z"}}},
    ]
    idle_since = 1795417200.0
    first = reclaimer.holders(users, {"ann/", "bo/lab"}, now=idle_since + 1000)
    assert [h.gpu_idle_since for h in first] == [idle_since, idle_since]  # nothing known of the GPU yet
    second = reclaimer.holders(users, {"ann/", "bo/lab"}, now=idle_since + 1030)
    assert [h.gpu_idle_since for h in second] == [idle_since, idle_since + 1030]


class ProcessSamplingNvml(RecordedNvml):
    """Two cards; NVML's per-process utilization as nvidia-ml-py returns it: its own ctypes
    structure per sample, and its NVMLError "Not Found" on a card where no process ran since."""

    NVMLError, NVMLError_NotSupported = pynvml.NVMLError, pynvml.NVMLError_NotSupported

    def __init__(self) -> None:
        super().__init__()
        self.asked_since: list[int] = []

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - NVML's name
        return 2

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since_us: int) -> list[Any]:  # noqa: N802
        self.asked_since.append(since_us)
        if handle[1] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        sample = pynvml.c_nvmlProcessUtilizationSample_t
        return [
            sample(pid=4242, timeStamp=since_us + 100_000, smUtil=3, memUtil=1, encUtil=0, decUtil=0),
            sample(pid=4242, timeStamp=since_us + 200_000, smUtil=41, memUtil=9, encUtil=0, decUtil=0),
            sample(pid=4343, timeStamp=since_us + 200_000, smUtil=0, memUtil=0, encUtil=0, decUtil=0),
        ]


def test_nvml_per_process_utilization_is_each_processes_highest_since_the_last_look() -> None:
    nvml = ProcessSamplingNvml()
    first, second = nvml_samples(nvml, process_utilization_since_us=1_795_417_200_000_000)
    assert first.process_sm_pct == ((4242, 41), (4343, 0))
    assert second.process_sm_pct == ()  # "Not Found": no process ran a kernel since
    assert nvml.asked_since == [1_795_417_200_000_000] * 2
    assert nvml_samples(ProcessSamplingNvml())[0].process_sm_pct == ()  # the exporter does not ask


def test_each_servers_utilization_is_its_busiest_process() -> None:
    samples = [card(0, 70.0, ((10, GiB), (20, GiB)), ((10, 2), (11, 30), (20, 0))), card(1, 9.0, (), ((99, 80),))]
    busiest = process_utilization(samples, OWNERS.get, {"ann/", "bo/lab", "cy/"})
    assert busiest == {"ann/": 30.0, "bo/lab": 0.0, "cy/": 0.0}  # 99: no notebook server's


def test_on_a_shared_busy_card_the_server_whose_processes_ran_kernels_is_busy_and_the_other_idle(
    tmp_path: Path,
) -> None:
    # ann and bo share card 0 at 60 %: the card alone cannot say whose work it is.
    def source() -> list[GpuSample]:
        return [card(0, 60.0, ((10, GiB), (20, GiB)), ((10, 0), (20, 57)))]

    reclaimer = Reclaimer("http://hub", "token", Ledger(tmp_path / "l.sqlite"), 900, 180, source, OWNERS.get)
    users = [
        {"name": "ann", "servers": {"": {"ready": True, "last_activity": "2026-11-23T07:00:00Z"}}},
        {"name": "bo", "servers": {"lab": {"ready": True, "last_activity": "2026-11-23T07:00:00Z"}}},
    ]
    held = reclaimer.holders(users, {"ann/", "bo/lab"}, now=1795417200.0 + 1000)
    assert [(h.key, h.gpu_idle_since) for h in held] == [("ann/", 1795417200.0), ("bo/lab", None)]


def notebook_pod(user: str, server: str = "", backend: str | None = "gpushare", **meta: Any) -> dict[str, Any]:
    annotations = {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server}
    if backend:
        annotations["gpuslice.io/sharing-backend"] = backend
    return {"metadata": {"name": f"jupyter-{user}", "annotations": annotations, **meta}, "status": {"phase": "Running"}}


def test_on_kubernetes_the_servers_holding_a_gpu_are_the_pods_naming_a_sharing_backend() -> None:
    pods = [
        notebook_pod("ann"),
        notebook_pod("bo", "lab", backend="whole"),
        notebook_pod("cy", backend=None),  # CPU only: never reclaimed for the line
        notebook_pod("dee", deletionTimestamp="2026-11-23T07:00:00Z"),  # already going
    ]
    assert gpu_keys_from_pods(pods) == {"ann/", "bo/lab"}


class ReclaimingHub(requests.Session):
    """JupyterHub's users API as the reclaimer reads it, with one idle GPU server; the stops it was sent."""

    def __init__(self, idle_since: str) -> None:
        super().__init__()
        self.users = [{"name": "ann", "servers": {"": {"ready": True, "last_activity": idle_since}}}]
        self.stopped: list[str] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = 200
        if str(method) == "DELETE":
            self.stopped.append(str(url))
            response.status_code = 204
        response._content = json.dumps(self.users).encode()
        return response


def test_the_warning_says_when_the_stop_comes_and_the_stop_comes_then(tmp_path: Path) -> None:
    """Announced at the warning; the reclaimer looks again at that moment (not up to an interval later)."""
    from spawner.placement import Demand
    from spawner.waitline import Entry
    from spawner.words import INSTANT, parse_instant

    ledger = Ledger(tmp_path / "ledger.sqlite")
    waiter = Entry("bo/", "bo", Demand(slice_units=float(4 * GiB)), 4 * GiB, None, 0.0, seen=1e12)
    ledger.take_turn("bo/", lambda holds, line, mine, reservations: (None, waiter))
    idle_since = 1795417200.0  # 2026-11-23T07:00:00Z
    hub = ReclaimingHub("2026-11-23T07:00:00Z")
    reclaimer = Reclaimer("http://hub", "token", ledger, 900, 180, gpu_keys=lambda: {"ann/"})
    reclaimer.session = hub
    warned_at = idle_since + 900 - 180 + 3  # the first look after the warning is due
    assert reclaimer.step(warned_at) == []
    [warning] = [e for e in ledger.history("ann/") if e.kind == "warned"]
    said = INSTANT.search(warning.message)
    assert said is not None, warning.message
    announced = parse_instant(said.group(0))
    assert announced == int(stop_at(warned_at, 180, activity_report_interval(180)))  # whole seconds in words
    assert reclaimer.next_look(warned_at + 1, 30.0) == 30.0  # nothing due within the interval
    assert reclaimer.next_look(announced - 4, 30.0) == pytest.approx(4, abs=1)  # the next look is at the stop
    assert reclaimer.step(announced - 2) == [] and hub.stopped == []
    assert reclaimer.step(announced + 1) == ["ann/"] and hub.stopped == ["http://hub/users/ann/server"]
