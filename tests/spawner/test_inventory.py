import json
from typing import Any

import pytest

from spawner.backends import Backend
from spawner.gpus import simulated_gpus
from spawner.inventory import (
    Allocation,
    build_kube,
    build_local,
    cpu_milli,
    holds_resources,
    parse_hami_pod_devices,
    parse_hami_register,
)
from spawner.shares import GiB, MiB


def node(name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": extra.pop("annotations", {})},
        "spec": extra.pop("spec", {}),
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", **allocatable},
            "conditions": extra.pop("conditions", [{"type": "Ready", "status": "True"}]),
        },
    }
    return obj


def pod(
    name: str,
    node_name: str,
    limits: dict[str, str],
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    user: str = "alice",
    **meta: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "jhub",
            "labels": {"component": "singleuser-server"},
            "annotations": {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": "", **(annotations or {})},
            **meta,
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "notebook", "resources": {"limits": limits, "requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
        },
        "status": {"phase": phase},
    }


def test_cpu_quantities() -> None:
    assert cpu_milli("2") == 2000
    assert cpu_milli("250m") == 250
    assert cpu_milli("1.5") == 1500


def test_gpushare_node_splits_gib_per_card_and_reads_the_index_annotation() -> None:
    nodes = [node("n1", {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "30"}, {"nvidia.com/gpu.product": "T4"})]
    pods = [
        pod("a", "n1", {"aliyun.com/gpu-mem": "4"}, {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4"}),
        pod(
            "b",
            "n1",
            {"aliyun.com/gpu-mem": "3"},
            {"scheduler.framework.gpushare.allocation": json.dumps({"0": {"0": 3}})},
            user="bob",
        ),
    ]
    inv = build_kube(nodes, pods, Backend.GPUSHARE)
    gpus = inv.nodes[0].gpus
    assert [g.memory_bytes for g in gpus] == [15 * GiB, 15 * GiB]
    assert gpus[0].allocations == [Allocation("bob", "", 3 * GiB, "b")]
    assert gpus[1].allocations == [Allocation("alice", "", 4 * GiB, "a")]
    assert gpus[1].free_bytes == 11 * GiB
    assert inv.nodes[0].cpu_used_milli == 1000
    assert inv.nodes[0].memory_used_bytes == 2 * GiB
    assert gpus[0].model == "T4"


def test_finished_and_deleting_pods_hold_nothing() -> None:
    nodes = [node("n1", {"aliyun.com/gpu-count": "1", "aliyun.com/gpu-mem": "15"})]
    idx = {"ALIYUN_COM_GPU_MEM_IDX": "0"}
    pods = [
        pod("done", "n1", {"aliyun.com/gpu-mem": "4"}, idx, phase="Succeeded"),
        pod("failed", "n1", {"aliyun.com/gpu-mem": "4"}, idx, phase="Failed"),
        pod("going", "n1", {"aliyun.com/gpu-mem": "4"}, idx, deletionTimestamp="2026-11-22T05:00:00Z"),
        pod("pending", "", {"aliyun.com/gpu-mem": "4"}, phase="Pending"),
    ]
    inv = build_kube(nodes, pods, Backend.GPUSHARE)
    assert inv.allocated_bytes == 0
    assert inv.nodes[0].cpu_used_milli == 0
    assert not holds_resources(pods[0]) and holds_resources(pods[3])


HAMI_JSON = json.dumps(
    [
        {"id": "GPU-aaa", "count": 10, "devmem": 32768, "devcore": 100, "type": "NVIDIA-Tesla V100", "health": True},
        {"id": "GPU-bbb", "count": 10, "devmem": 32768, "devcore": 100, "type": "NVIDIA-Tesla V100", "health": False},
    ]
)
HAMI_OLD = "GPU-aaa,10,32768,100,NVIDIA-Tesla V100,0,true:GPU-bbb,10,32768,100,NVIDIA-Tesla V100,0,false:"


@pytest.mark.parametrize("register", [HAMI_JSON, HAMI_OLD])
def test_hami_register_in_both_formats(register: str) -> None:
    devices = parse_hami_register(register)
    assert [(d["id"], d["devmem"], d["health"]) for d in devices] == [
        ("GPU-aaa", 32768, True),
        ("GPU-bbb", 32768, False),
    ]


def test_hami_allocations_by_uuid() -> None:
    assert parse_hami_pod_devices("GPU-aaa,NVIDIA,3000,30:;") == [[("GPU-aaa", 3000)], []]
    assert parse_hami_pod_devices("GPU-aaa,NVIDIA,1000,0:GPU-bbb,NVIDIA,2000,0:;GPU-aaa,NVIDIA,500,0:;") == [
        [("GPU-aaa", 1000), ("GPU-bbb", 2000)],
        [("GPU-aaa", 500)],
        [],
    ]
    nodes = [node("n1", {"nvidia.com/gpu": "20"}, annotations={"hami.io/node-nvidia-register": HAMI_JSON})]
    pods = [
        pod(
            "a",
            "n1",
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
            {"hami.io/vgpu-devices-allocated": "GPU-aaa,NVIDIA,3000,30:;", "hami.io/vgpu-node": "n1"},
        )
    ]
    inv = build_kube(nodes, pods, Backend.HAMI)
    first, second = inv.nodes[0].gpus
    assert first.uuid == "GPU-aaa" and first.memory_bytes == 32 * GiB
    assert first.allocations == [Allocation("alice", "", 3000 * MiB, "a")]
    assert not second.healthy and not second.allocations


def test_hami_bad_annotation_is_reported() -> None:
    with pytest.raises(ValueError, match=r"bad hami\.io/vgpu-devices-allocated entry"):
        parse_hami_pod_devices("GPU-aaa,NVIDIA:;")


def test_whole_gpus_take_the_first_free_cards() -> None:
    labels = {"nvidia.com/gpu.product": "A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    nodes = [node("n1", {"nvidia.com/gpu": "4"}, labels)]
    pods = [pod("a", "n1", {"nvidia.com/gpu": "2"}), pod("b", "n1", {"nvidia.com/gpu": "1"}, user="bob")]
    gpus = build_kube(nodes, pods, Backend.WHOLE).nodes[0].gpus
    assert [bool(g.allocations) for g in gpus] == [True, True, True, False]
    assert gpus[0].allocated_bytes == 80 * GiB and gpus[0].allocations[0].whole
    assert gpus[2].allocations[0].user == "bob"


def test_mig_instances_are_devices_of_their_profile() -> None:
    nodes = [
        node(
            "n1",
            {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
            {"nvidia.com/gpu.product": "H100-80GB-HBM3"},
        )
    ]
    pods = [pod("a", "n1", {"nvidia.com/mig-1g.10gb": "1"})]
    gpus = build_kube(nodes, pods, Backend.MIG).nodes[0].gpus
    assert [(g.mig_profile, g.memory_bytes) for g in gpus] == [
        ("1g.10gb", 9984 * MiB),
        ("1g.10gb", 9984 * MiB),
        ("3g.40gb", 40448 * MiB),
    ]
    assert [len(g.allocations) for g in gpus] == [1, 0, 0]


def test_timeslicing_reads_our_slice_annotation() -> None:
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384", "nvidia.com/gpu.product": "T4"}
    nodes = [node("n1", {"nvidia.com/gpu.shared": "8"}, labels)]
    slice_ = {"gpuslice.io/gpu-memory-bytes": str(4 * GiB)}
    pods = [
        pod("a", "n1", {"nvidia.com/gpu.shared": "1"}, slice_),
        pod("b", "n1", {"nvidia.com/gpu.shared": "1"}, slice_),
    ]
    gpus = build_kube(nodes, pods, Backend.TIMESLICING).nodes[0].gpus
    assert len(gpus) == 2
    # Spread over the cards as the device plugin does.
    assert [g.allocated_bytes for g in gpus] == [4 * GiB, 4 * GiB]


def test_not_ready_or_cordoned_nodes_are_unhealthy() -> None:
    labels = {"nvidia.com/gpu.memory": "16384"}
    nodes = [
        node("down", {"nvidia.com/gpu": "1"}, labels, conditions=[{"type": "Ready", "status": "False"}]),
        node("cordoned", {"nvidia.com/gpu": "1"}, labels, spec={"unschedulable": True}),
        node("up", {"nvidia.com/gpu": "1"}, labels),
    ]
    inv = build_kube(nodes, [], Backend.WHOLE)
    assert [n.healthy for n in inv.nodes] == [False, False, True]
    assert [g.healthy for g in inv.gpus()] == [False, False, True]


def test_local_inventory_from_simulated_gpus_and_ledger() -> None:
    gpus = simulated_gpus("2x16GiB:T4,1x80GiB:H100")
    inv = build_local(
        gpus, [(0, Allocation("alice", "", 4 * GiB, "k1")), (2, Allocation("bob", "gpu", 40 * GiB, "k2"))]
    )
    assert [g.free_bytes for g in inv.gpus()] == [12 * GiB, 16 * GiB, 40 * GiB]
    assert all(g.simulated for g in inv.gpus())
    assert inv.capacity_bytes == 112 * GiB and inv.allocated_bytes == 44 * GiB


def test_local_allocation_on_a_missing_gpu_is_an_error() -> None:
    with pytest.raises(ValueError, match="GPU 5, which does not exist"):
        build_local(simulated_gpus("1x16GiB"), [(5, Allocation("alice", "", GiB, "k"))])


def test_local_inventory_leaves_the_machines_gpus_unchanged() -> None:
    gpus = simulated_gpus("1x16GiB:T4")
    first = build_local(gpus, [(0, Allocation("alice", "", 4 * GiB, "k1"))])
    second = build_local(gpus, [(0, Allocation("bob", "", 2 * GiB, "k2"))])
    assert gpus[0].allocations == []
    assert [a.user for a in first.nodes[0].gpus[0].allocations] == ["alice"]
    assert [a.user for a in second.nodes[0].gpus[0].allocations] == ["bob"]


def test_mig_instances_are_sized_by_the_nodes_product_label() -> None:
    nodes = [
        node("a100", {"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        node("h200", {"nvidia.com/mig-1g.18gb": "1"}, {"nvidia.com/gpu.product": "NVIDIA-H200"}),
    ]
    inventory = build_kube(nodes, [], Backend.MIG)
    sizes = [(g.node, g.mig_profile, g.memory_bytes // MiB) for g in inventory.gpus()]
    assert sizes == [("a100", "1g.10gb", 9728), ("h200", "1g.18gb", 17166)]  # 1g.10gb is not 9,537 MiB
    assert inventory.warnings == []


def test_mig_instances_of_an_unknown_product_are_left_out_with_a_warning_naming_the_label() -> None:
    nodes = [node("n1", {"nvidia.com/mig-1g.10gb": "2"}, {"nvidia.com/gpu.product": "NVIDIA-L40S"})]
    inventory = build_kube(nodes, [], Backend.MIG)
    assert list(inventory.gpus()) == []
    assert len(inventory.warnings) == 1
    assert "node n1" in inventory.warnings[0] and "nvidia.com/gpu.product='NVIDIA-L40S'" in inventory.warnings[0]
