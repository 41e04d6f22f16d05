"""hub/reclaimer.py's reading of JupyterHub's users and of the GPUs (the service itself runs in
tests/e2e/test_waiting_line.py, and on Kubernetes in tests/kube/test_kube_line.py)."""

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import requests

from hub.exporter import Owner
from hub.reclaimer import (
    Hold,
    Reclaimer,
    gpu_evidence,
    gpu_holds_from_pods,
    holders_from_hub,
    max_hold_options,
    process_utilization,
)
from spawner.gpus import GpuSample, nvml_samples
from spawner.ledger import Held, Ledger, reclaim_notice
from spawner.placement import Demand
from spawner.quotas import read_groups
from spawner.waitline import HELD_TOO_LONG, Entry, Holder, activity_report_interval, stop_at
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
    assert set(gpu_holds_from_pods(pods)) == {"ann/", "bo/lab"}


def test_on_kubernetes_a_hold_starts_when_its_pod_was_made_and_is_charged_to_its_annotated_group() -> None:
    pod = notebook_pod("ann", creationTimestamp="2026-11-23T07:00:00Z")
    pod["metadata"]["annotations"]["gpuslice.io/group"] = "ml101"
    assert gpu_holds_from_pods([pod, notebook_pod("bo")]) == {
        "ann/": Hold(1795417200.0, "ml101"),
        "bo/": Hold(None, None),  # no creation time known: never stopped for holding too long
    }


class HubDouble:
    """JupyterHub's REST API as the reclaimer uses it: ``GET /users?state=active`` and ``DELETE`` a server."""

    def __init__(self, users: list[dict[str, Any]]) -> None:
        self.users, self.deleted = users, []

    def get(self, url: str, **kwargs: Any) -> Any:
        assert url.endswith("/users") and kwargs["params"] == {"state": "active"}
        return SimpleNamespace(json=lambda: self.users, raise_for_status=lambda: None)

    def delete(self, url: str, **kwargs: Any) -> Any:
        self.deleted.append(url.split("/users/", 1)[1])
        return SimpleNamespace(status_code=204)


def holding_and_waiting(ledger: Ledger, holder: str, group: str | None, waiter: str, seen: float) -> None:
    """``holder`` holds 4 GiB charged to ``group`` (placed now) and ``waiter`` waits in line."""
    held = [Held(f"{holder}/", 0, holder, "", 4 * GiB, group=group)]
    ledger.take_turn(f"{holder}/", lambda *_: (held, None))
    entry = Entry(f"{waiter}/", waiter, Demand(slice_units=float(4 * GiB)), 4 * GiB, group, time.time(), seen=seen)
    ledger.take_turn(f"{waiter}/", lambda *_: (None, entry))


def forged_busy(now: float) -> list[dict[str, Any]]:
    """ann's server says it was active a moment ago, every time it is asked (a script posting activity)."""
    stamp = datetime.fromtimestamp(now - 1, UTC).isoformat()
    return [{"name": "ann", "servers": {"": {"ready": True, "last_activity": stamp}}}]


def test_a_server_that_looks_busy_is_warned_then_stopped_at_its_classs_max_hold_while_someone_waits(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    start = time.time()
    holding_and_waiting(ledger, "ann", "ml101", "bo", seen=start + 10 * 3600)  # bo never leaves the line
    reclaimer = Reclaimer("http://hub", "token", ledger, 900, 180, max_holds={"ml101": 3600})
    hub = HubDouble([])
    reclaimer.session = hub  # type: ignore[assignment]

    def step(after_s: float) -> list[str]:
        hub.users = forged_busy(start + after_s)
        return reclaimer.step(start + after_s)

    assert step(3000) == [] and ledger.history("ann/") == []  # within its hour: not even warned
    assert step(3600 - 170) == []
    warning = ledger.history("ann/")[-1]
    assert warning.kind == "warned" and warning.message.startswith(HELD_TOO_LONG)
    notice = reclaim_notice(warning, warning.created + 1, 180)
    assert notice is not None and "as long as your class allows" in notice and "unless" not in notice
    assert step(3600) == []  # the warning's three minutes are not over
    assert step(3600 + 15) == ["ann/"]  # busy or not
    assert hub.deleted == ["ann/server"]
    stopping = ledger.history("ann/")[-1]
    assert stopping.kind == "stopping" and HELD_TOO_LONG in stopping.message


def test_without_a_max_hold_or_anyone_waiting_a_busy_server_keeps_its_slice(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    start = time.time()
    holding_and_waiting(ledger, "ann", "ml101", "bo", seen=start + 10 * 3600)
    hub = HubDouble([])
    for max_holds in ({}, {"cv202": 60.0}):  # no cap, or a cap for another class
        reclaimer = Reclaimer("http://hub", "token", ledger, 900, 180, max_holds=max_holds)
        reclaimer.session = hub  # type: ignore[assignment]
        for after_s in (3600.0, 5 * 3600.0):
            hub.users = forged_busy(start + after_s)
            assert reclaimer.step(start + after_s) == []
    assert hub.deleted == [] and ledger.history("ann/") == []


def test_the_reclaimer_is_given_each_classs_max_hold_in_seconds() -> None:
    groups = read_groups({"ml101": {"max_hold": "2h"}, "cv202": {}, "lab": {"maxHold": 5400}})
    assert max_hold_options(groups) == ["--max-hold=ml101=7200", "--max-hold=lab=5400"]


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
    from spawner.words import INSTANT, parse_instant

    ledger = Ledger(tmp_path / "ledger.sqlite")
    waiter = Entry("bo/", "bo", Demand(slice_units=float(4 * GiB)), 4 * GiB, None, 0.0, seen=1e12)
    ledger.take_turn("bo/", lambda holds, line, mine, reservations: (None, waiter))
    idle_since = 1795417200.0  # 2026-11-23T07:00:00Z
    hub = ReclaimingHub("2026-11-23T07:00:00Z")
    reclaimer = Reclaimer("http://hub", "token", ledger, 900, 180, gpu_holds=lambda: {"ann/": Hold(None, None)})
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


def test_a_server_whose_owner_closed_the_tab_goes_to_the_line_after_the_left_timeout(tmp_path: Path) -> None:
    """ann's kernels were used 5 minutes ago (the idle rule is 15), her last page closed 2 minutes ago:
    warned at once for the left rule (its lead a third of 2 minutes), stopped at the announced time."""
    from spawner.waitline import LEFT, WARNED, Presence, PresenceRule

    ledger = Ledger(tmp_path / "ledger.sqlite")
    waiter = Entry("bo/", "bo", Demand(slice_units=float(4 * GiB)), 4 * GiB, None, 0.0, seen=1e12)
    ledger.take_turn("bo/", lambda holds, line, mine, reservations: (None, waiter))
    used = 1795417200.0  # 2026-11-23T07:00:00Z
    now = used + 300
    ledger.record_presence("ann/", Presence(now - 5, pages=0, connections=0, last_input=used, last_page=now - 120))
    rule = PresenceRule(left_timeout=120, no_input_timeout=480, release_timeout=600, stale_after=90)
    hub = ReclaimingHub("2026-11-23T07:00:00Z")
    reclaimer = Reclaimer(
        "http://hub", "token", ledger, 900, 180, gpu_holds=lambda: {"ann/": Hold(used - 60, None)}, rule=rule
    )
    reclaimer.session = hub
    assert reclaimer.step(now) == []
    [warning] = [e for e in ledger.history("ann/") if e.kind == "warned"]
    assert warning.message.startswith(WARNED[LEFT])
    assert reclaimer.warned["ann/"].stops_at == now + 40 + 1.1 * activity_report_interval(180)
    assert reclaimer.step(now + 60) == []  # the announced time has not come
    assert reclaimer.step(now + 74) == ["ann/"] and hub.stopped == ["http://hub/users/ann/server"]
    stopping = ledger.history("ann/")[-1]
    assert (
        stopping.kind == "stopping" and stopping.message == "the GPU line's reclaimer: nobody there while others waited"
    )


def test_nobody_waiting_a_server_whose_owner_left_long_ago_is_released_and_a_fresh_report_keeps_one(
    tmp_path: Path,
) -> None:
    from spawner.waitline import RELEASED, WARNED, Presence, PresenceRule

    ledger = Ledger(tmp_path / "ledger.sqlite")  # nobody in line
    used = 1795417200.0
    now = used + 700
    rule = PresenceRule(left_timeout=120, no_input_timeout=480, release_timeout=600, stale_after=90)
    hub = ReclaimingHub("2026-11-23T07:00:00Z")
    reclaimer = Reclaimer(
        "http://hub", "token", ledger, 900, 180, gpu_holds=lambda: {"ann/": Hold(used - 60, None)}, rule=rule
    )
    reclaimer.session = hub
    assert reclaimer.step(now) == []  # no report: nobody can tell, and the idle rule needs someone waiting
    ledger.record_presence("ann/", Presence(now - 5, pages=1, connections=1, last_input=used + 650))
    assert reclaimer.step(now) == [] and ledger.history("ann/") == []  # input 50 s ago: there
    ledger.record_presence("ann/", Presence(now - 5, pages=1, connections=1, last_input=used))
    assert reclaimer.step(now) == []  # a page open, no input for 700 s: warned for release
    assert ledger.history("ann/")[-1].message.startswith(WARNED[RELEASED])
    stop = reclaimer.warned["ann/"].stops_at
    ledger.record_presence("ann/", Presence(stop - 1, pages=1, connections=1, last_input=used))
    assert reclaimer.step(stop) == ["ann/"] and hub.stopped == ["http://hub/users/ann/server"]
    assert ledger.history("ann/")[-1].message.endswith(": released")


def test_a_report_from_before_the_slice_was_placed_is_an_earlier_servers_and_is_not_read(tmp_path: Path) -> None:
    from hub.reclaimer import with_presence
    from spawner.waitline import Presence

    old = Presence(1000.0, pages=0)
    holders = [Holder("ann/", True, 0.0, 0.0, held_since=1500.0), Holder("bo/", True, 0.0, 0.0, held_since=900.0)]
    joined = with_presence(holders, {"ann/": old, "bo/": old})
    assert [h.presence for h in joined] == [None, old]
