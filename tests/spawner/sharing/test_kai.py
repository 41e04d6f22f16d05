"""The kai backend: KAI Scheduler's fraction annotations, queue label and scheduler; the inventory from its
reservation pods and fractional pods; a class's queue as KAI writes it (fixtures/kai_cluster.yaml and
kai_queues.yaml cite their sources)."""

from pathlib import Path
from typing import Any

import yaml

from spawner import sharing
from spawner.inventory import Allocation
from spawner.shares import GiB, GpuRequest, MiB
from spawner.sharing.base import Isolation, Listing, Target
from spawner.sharing.kai import NOT_TRIED, RESERVATIONS, ClassQueue, Kai, QueuedPod, count_of, read_queue

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


def test_a_classs_queue_is_read_as_kai_writes_it_with_its_pods_kai_has_not_placed() -> None:
    items = yaml.safe_load((FIXTURES / "kai_queues.yaml").read_text())["items"]
    queues = {i["metadata"]["name"]: i for i in items if i["kind"] == "Queue"}
    pods = [i for i in items if i["kind"] == "Pod"]
    no_room = "0/1 nodes are available: 1 node(s) didn't have enough resources: GPUs."
    assert read_queue("ml101", queues["ml101"], pods) == ClassQueue(
        "ml101",
        parent="gpuslice",
        gpu_quota=2.5,
        gpu_limit=2.5,
        allocated_gpus=0.25,  # alice's 4096 MiB of a 16384 MiB card; bob waits
        requested_gpus=0.0,  # asked as memory: KAI counts run.ai/gpu.memory, not cards
        requested_memory_bytes=12 * GiB,
        waiting=(QueuedPod("bob", "", "jupyter-bob", no_room),),  # cv202's dana waits in her own queue
    )
    parent = read_queue("gpuslice", queues["gpuslice"], pods)
    assert (parent.gpu_quota, parent.gpu_limit, parent.allocated_gpus, parent.requested_gpus) == (-1, -1, 0.75, 0.5)
    assert parent.requested_memory_bytes == 16 * GiB and parent.waiting == ()
    lost = {"metadata": {"name": "jupyter-eve", "labels": {"kai.scheduler/queue": "ai2"}}, "spec": {}, "status": {}}
    assert read_queue("ai2", None, [lost]) == ClassQueue(
        "ai2", exists=False, waiting=(QueuedPod("", "", "jupyter-eve", NOT_TRIED),)
    )


def test_kais_quantities_are_read_as_resource_quantity_writes_them() -> None:
    # A fraction from memory is rounded up to nano (4096 of 6144 MiB); sums of cards keep milli.
    assert count_of("666666667n") == 0.666666667 and count_of("2500m") == 2.5 and count_of("4096") == 4096
    assert count_of(1) == 1 and count_of("1k") == 1000 and count_of("1Ki") == 1024
    assert count_of("two") == 0  # unreadable counts nothing, as an unreadable amount in the inventory
