"""The inventory reads HAMi's annotations as HAMi's own scheduler counts them.

Fixtures hold the literal strings HAMi writes (tests/spawner/sharing/fixtures/hami_*.yaml name the
source files and commit they were read from).
"""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from spawner.inventory import Allocation, Gpu, Inventory
from spawner.shares import GiB, GpuRequest, MiB, ShareError
from spawner.sharing import build_kube
from spawner.sharing.base import Isolation, Target
from spawner.sharing.hami import Hami, parse_pod_devices, parse_register, pod_usage
from tests.spawner.sharing.objects import node, pod

FIXTURES = Path(__file__).parent / "fixtures"
FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)
QUARTER = GpuRequest(fraction=0.25)
CARD_A, CARD_B, CARD_C, CARD_D = (
    "GPU-5f2b0a6e-9b51-4d1c-8d27-6a1f0c7f1a01",
    "GPU-8c1d3e44-2f6a-4b7e-9a10-3d5e7c9b2b02",
    "GPU-1a9e7f30-6c2d-4e8b-b4f1-0e2a5d6c3c03",
    "GPU-3b4c5d6e-7f80-4192-a3b4-c5d6e7f80d04",
)


def hami_node() -> dict[str, Any]:
    node: dict[str, Any] = yaml.safe_load((FIXTURES / "hami_node.yaml").read_text())
    return node


def hami_pod(name: str) -> dict[str, Any]:
    pods = yaml.safe_load((FIXTURES / "hami_pods.yaml").read_text())["items"]
    return next(p for p in pods if p["metadata"]["name"] == name)


def build(*pod_names: str, **kwargs: Any) -> Inventory:
    return build_kube([hami_node()], [hami_pod(n) for n in pod_names], Hami(), **kwargs)


def card(inventory: Inventory, uuid: str) -> Gpu:
    return next(g for g in inventory.gpus() if g.uuid == uuid)


def held_mib(inventory: Inventory, uuid: str) -> list[tuple[str, int]]:
    return [(a.owner, a.memory_bytes // MiB) for a in card(inventory, uuid).allocations]


def test_register_reads_go_omitempty_json() -> None:
    """No "health" key is Go's false: the card is unhealthy; no "index" is card 0."""
    inventory = build()
    gpus = list(inventory.gpus())
    assert [(g.uuid, g.index, g.healthy) for g in gpus] == [
        (CARD_A, 0, True),
        (CARD_B, 1, False),  # registered without "health": HAMi never schedules on it
        (CARD_C, 2, True),
        (CARD_D, 3, False),  # hami.io/device-cordon
    ]
    assert {g.memory_bytes for g in gpus} == {81920 * MiB}
    assert gpus[0].model == "NVIDIA A100-SXM4-80GB"


def test_terminating_pod_keeps_its_devices_until_it_is_gone() -> None:
    inventory = build("jupyter-carol", "jupyter-dave")
    # carol is being deleted but still Running: HAMi keeps her 40000 MiB; dave Succeeded: freed.
    assert held_mib(inventory, CARD_C) == [("jupyter-carol", 40000)]


def test_pod_between_filter_and_bind_holds_the_node_filter_chose() -> None:
    """Filter writes vgpu-node and the allocation before the pod is bound (no spec.nodeName yet)."""
    inventory = build("jupyter-alice", "jupyter-bob")
    assert held_mib(inventory, CARD_A) == [("jupyter-alice", 20000), ("jupyter-bob", 30000)]
    # The pod's CPU and memory are the kube-scheduler's to count once bound.
    assert inventory.nodes[0].cpu_used_milli == 0


def test_init_containers_count_their_peak_against_the_app_containers_sum() -> None:
    running_init = build("jupyter-erin")
    assert held_mib(running_init, CARD_C) == [("jupyter-erin", 30000)]  # max(30000, 10000 + 10000)
    init_done = build("jupyter-frank")
    assert held_mib(init_done, CARD_C) == [("jupyter-frank", 20000)]  # init finished: app containers only


def test_one_container_on_two_cards_holds_both() -> None:
    inventory = build("jupyter-grace")
    assert held_mib(inventory, CARD_A) == [("jupyter-grace", 8000)]
    assert held_mib(inventory, CARD_C) == [("jupyter-grace", 8000)]


def test_nvidia_gpu_without_hami_annotations_is_not_a_whole_card() -> None:
    """On HAMi nvidia.com/gpu counts vGPUs; a pod HAMi did not schedule holds nothing HAMi counts."""
    inventory = build("jupyter-judy")
    assert inventory.allocated_bytes == 0


def test_pod_on_a_node_that_is_gone_is_skipped_with_a_warning() -> None:
    inventory = build("jupyter-alice", "jupyter-heidi")
    assert held_mib(inventory, CARD_A) == [("jupyter-alice", 20000)]
    assert any("jhub/jupyter-heidi" in w and "gpu-gone" in w for w in inventory.warnings)


def test_malformed_pod_annotation_skips_that_pod_only() -> None:
    inventory = build("jupyter-alice", "jupyter-ivan")
    assert held_mib(inventory, CARD_A) == [("jupyter-alice", 20000)]
    assert any("jupyter-ivan" in w and "lots" in w for w in inventory.warnings)


def test_malformed_register_leaves_the_node_without_cards_and_says_so() -> None:
    node = hami_node()
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = '[{"id": "GPU-x", "devmem": 1'
    inventory = build_kube([node], [hami_pod("jupyter-alice")], Hami())
    assert list(inventory.gpus()) == []
    assert any("gpu-a" in w and "hami.io/node-nvidia-register" in w for w in inventory.warnings)


def test_expired_handshake_on_a_node_without_gpus_takes_its_cards_away() -> None:
    node = hami_node()
    late = datetime(2026, 11, 23, 5, 1, 1, tzinfo=UTC)  # 61 s after "Requesting_2026-11-23 05:00:00"
    assert len(list(build_kube([node], [], Hami(), now=late).gpus())) == 4  # allocatable still has GPUs
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    soon = datetime(2026, 11, 23, 5, 0, 59, tzinfo=UTC)
    assert len(list(build_kube([node], [], Hami(), now=soon).gpus())) == 4
    gone = build_kube([node], [], Hami(), now=late)
    assert list(gone.gpus()) == [] and any("handshake" in w for w in gone.warnings)


def test_allocated_annotation_decodes_per_container_as_hami() -> None:
    assert parse_pod_devices(f"{CARD_A},NVIDIA,20000,0:;") == [[(CARD_A, 20000)], []]
    assert parse_pod_devices(";;") == [[], [], []]
    # An entry without a comma is skipped, as HAMi's DecodeContainerDevices does.
    assert parse_pod_devices(f"junk:{CARD_A},NVIDIA,1,0:;") == [[(CARD_A, 1)], []]
    with pytest.raises(ValueError, match="uuid,type,memory,cores"):
        parse_pod_devices(f"{CARD_A},NVIDIA,3000:;")  # 3 fields: HAMi refuses it
    with pytest.raises(ValueError, match=r"bad hami\.io/vgpu-devices-allocated entry"):
        parse_pod_devices(f"{CARD_A},NVIDIA,3000,most:;")


def test_usage_without_an_allocation_is_empty() -> None:
    assert pod_usage(hami_pod("jupyter-judy")) == {}


def test_legacy_register_format_is_read_strictly() -> None:
    legacy = (
        f"{CARD_A},10,32768,100,NVIDIA-Tesla V100,0,true,0,hami-core:{CARD_B},10,32768,100,NVIDIA-Tesla V100,0,False:"
    )
    assert [(d["id"], d["health"], d["index"]) for d in parse_register(legacy)] == [
        (CARD_A, True, 0),
        (CARD_B, False, 1),  # seven fields: no index, so its place in the list
    ]
    with pytest.raises(ValueError, match="7 or 9 fields"):
        parse_register(f"{CARD_A},10,32768,100,NVIDIA-Tesla V100:")
    with pytest.raises(ValueError, match="not a boolean"):
        parse_register(f"{CARD_A},10,32768,100,NVIDIA-Tesla V100,0,yes:")


def test_hami_uses_mib_and_optional_cores() -> None:
    spec = Hami(cores_percent=30).render(GpuRequest(memory_bytes=4 * GiB + 1))
    assert spec.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4097", "nvidia.com/gpucores": "30"}
    assert spec.isolation is Isolation.SOFTWARE
    assert spec.warnings == ()


def test_hami_share_uses_the_memory_percentage() -> None:
    spec = Hami().render(QUARTER, Target(card_bytes=16 * GiB))
    assert spec.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}
    assert spec.env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)


def test_hami_refuses_impossible_core_share() -> None:
    with pytest.raises(ShareError, match="1 to 100"):
        Hami(cores_percent=150).render(FOUR_GIB)


HAMI_JSON = json.dumps(
    [
        {"id": "GPU-aaa", "count": 10, "devmem": 32768, "devcore": 100, "type": "NVIDIA-Tesla V100", "health": True},
        {"id": "GPU-bbb", "count": 10, "devmem": 32768, "devcore": 100, "type": "NVIDIA-Tesla V100", "health": False},
    ]
)


HAMI_OLD = "GPU-aaa,10,32768,100,NVIDIA-Tesla V100,0,true:GPU-bbb,10,32768,100,NVIDIA-Tesla V100,0,false:"


@pytest.mark.parametrize("register", [HAMI_JSON, HAMI_OLD])
def test_hami_register_in_both_formats(register: str) -> None:
    devices = parse_register(register)
    assert [(d["id"], d["devmem"], d["health"]) for d in devices] == [
        ("GPU-aaa", 32768, True),
        ("GPU-bbb", 32768, False),
    ]


def test_hami_allocations_by_uuid() -> None:
    assert parse_pod_devices("GPU-aaa,NVIDIA,3000,30:;") == [[("GPU-aaa", 3000)], []]
    assert parse_pod_devices("GPU-aaa,NVIDIA,1000,0:GPU-bbb,NVIDIA,2000,0:;GPU-aaa,NVIDIA,500,0:;") == [
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
    inv = build_kube(nodes, pods, Hami())
    first, second = inv.nodes[0].gpus
    assert first.uuid == "GPU-aaa" and first.memory_bytes == 32 * GiB
    assert first.allocations == [Allocation("alice", "", 3000 * MiB, "a")]
    assert not second.healthy and not second.allocations


def test_hami_bad_annotation_is_reported() -> None:
    with pytest.raises(ValueError, match=r"bad hami\.io/vgpu-devices-allocated entry"):
        parse_pod_devices("GPU-aaa,NVIDIA:;")


def test_seven_field_register_entries_take_the_card_index_from_their_place() -> None:
    """HAMi before v2.5 wrote no index: a two-card node is two cards, the pod's card the second."""
    objects = yaml.safe_load((FIXTURES / "hami_node_v2.4.yaml").read_text())["items"]
    nodes = [o for o in objects if o["kind"] == "Node"]
    pods = [o for o in objects if o["kind"] == "Pod"]
    inventory = build_kube(nodes, pods, Hami())
    assert [(g.index, g.uuid[:12], g.memory_bytes) for g in inventory.gpus()] == [
        (0, "GPU-00552014", 32768 * MiB),
        (1, "GPU-0fc3eda5", 32768 * MiB),
    ]
    second = inventory.nodes[0].gpus[1]
    assert second.allocations == [Allocation("olga", "", 8000 * MiB, "jupyter-olga")]
    assert inventory.warnings == []
