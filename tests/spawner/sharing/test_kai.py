"""The kai backend: KAI Scheduler's fraction annotations, queue label and scheduler; the inventory from its
reservation pods and fractional pods (fixtures/kai_cluster.yaml cites its sources)."""

from pathlib import Path
from typing import Any

import yaml

from spawner import sharing
from spawner.inventory import Allocation
from spawner.shares import GiB, GpuRequest, MiB
from spawner.sharing.base import Isolation, Listing, Target
from spawner.sharing.kai import RESERVATIONS, Kai

FIXTURES = Path(__file__).parent / "fixtures"


def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    items = yaml.safe_load((FIXTURES / "kai_cluster.yaml").read_text())["items"]
    nodes = [i for i in items if i["kind"] == "Node"]
    reservations = [i for i in items if i["metadata"].get("namespace") == "kai-resource-reservation"]
    pods = [i for i in items if i["kind"] == "Pod" and i not in reservations]
    return nodes, pods, reservations


def test_a_slice_asks_kai_for_memory_or_a_fraction_in_its_classs_queue() -> None:
    spec = Kai().render(GpuRequest(memory_bytes=4 * GiB), Target(card_bytes=23034 * MiB, group="ml101"))
    assert spec.scheduler_name == "kai-scheduler"
    assert spec.labels == {"kai.scheduler/queue": "ml101"}
    assert spec.annotations["gpu-memory"] == "4096" and spec.limits == {}
    assert spec.isolation is Isolation.NONE and "without memory isolation" in spec.warnings[0]
    quarter = Kai(queues={"ml101": "teaching"}).render(GpuRequest(fraction=0.25), Target(group="ml101"))
    assert quarter.annotations["gpu-fraction"] == "0.25" and quarter.labels == {"kai.scheduler/queue": "teaching"}
    whole = Kai().render(GpuRequest(gpus=1), Target())
    assert whole.limits == {"nvidia.com/gpu": "1"} and whole.labels == {"kai.scheduler/queue": "default-queue"}
    assert whole.scheduler_name == "kai-scheduler"


def test_the_inventory_puts_a_gpu_groups_fractions_on_the_card_its_reservation_pod_holds() -> None:
    nodes, pods, reservations = cluster()
    inventory = sharing.read(Kai(), Listing(nodes, pods, {RESERVATIONS.key: reservations}))[1]
    first, second = inventory.nodes[0].gpus
    assert first.uuid == "GPU-2c7d9e1f-0a3b-4c5d-8e6f-7a8b9c0d1e2f"
    assert first.allocations == [
        Allocation("cara", "", 4096 * MiB, "jupyter-cara"),
        Allocation("dan", "", 23034 * MiB // 2, "jupyter-dan"),
    ]
    assert second.allocations == [] and inventory.warnings == []  # eve waits in KAI's queue: nothing held


def test_a_fraction_whose_reservation_pod_is_not_listed_is_a_warning() -> None:
    nodes, pods, _ = cluster()
    inventory = sharing.build_kube(nodes, pods, Kai())
    assert inventory.allocated_bytes == 0
    assert any("jupyter-cara" in w and "no reservation pod holds" in w for w in inventory.warnings)
