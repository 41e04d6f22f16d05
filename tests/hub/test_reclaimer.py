"""hub/reclaimer.py's reading of JupyterHub's users and of the GPUs (the service itself runs in
tests/e2e/test_waiting_line.py)."""

from pathlib import Path

from hub.exporter import Owner
from hub.reclaimer import Reclaimer, gpu_evidence, holders_from_hub
from spawner.gpus import GpuSample
from spawner.ledger import Ledger
from spawner.waitline import Holder

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


def card(index: int, utilization: float, processes: tuple[tuple[int, int], ...]) -> GpuSample:
    used = sum(m for _, m in processes)
    return GpuSample(index, f"GPU-{index}", "H100", utilization, used, 80 * GiB, 40, 100, processes=processes)


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
