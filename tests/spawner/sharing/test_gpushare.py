"""The inventory reads gpushare's annotations and node resources as its own extender counts them.

Fixtures hold the literal strings gpushare writes (tests/spawner/sharing/fixtures/gpushare_*.yaml
name the source files and commits they were read from).
"""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spawner.inventory import Allocation, Inventory
from spawner.shares import GiB, GpuRequest, MiB, ShareError
from spawner.sharing import Listing, build_kube, read
from spawner.sharing.base import NO_ISOLATION_WARNING, Target
from spawner.sharing.gpushare import Gpushare
from spawner.sharing.gpushare import card_units as gpushare_card_units
from tests.spawner.sharing.objects import node, pod

FIXTURES = Path(__file__).parent / "fixtures"
V100_16 = 16160 * MiB
FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)
QUARTER = GpuRequest(fraction=0.25)


def items(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((FIXTURES / name).read_text())["items"]
    return found


def nodes(name: str) -> list[dict[str, Any]]:
    return [o for o in items("gpushare_nodes.yaml") if o["kind"] == "Node" and o["metadata"]["name"] == name]


def pods(*names: str) -> list[dict[str, Any]]:
    return [p for p in items("gpushare_pods.yaml") if p["metadata"]["name"] in names]


def held(inventory: Inventory, index: int) -> list[tuple[str, int]]:
    return [(a.owner, a.memory_bytes) for a in inventory.nodes[0].gpus[index].allocations]


def test_cards_are_sized_from_capacity_not_allocatable() -> None:
    """An unhealthy card leaves allocatable; the extender still gives each card capacity/count."""
    inventory = build_kube(nodes("t4-gib"), [], Gpushare())
    assert [g.memory_bytes for g in inventory.gpus()] == [15 * GiB, 15 * GiB]
    assert inventory.nodes[0].gpus[0].model == "Tesla-T4"


def test_unhealthy_configmap_marks_the_card() -> None:
    config_maps = [o for o in items("gpushare_nodes.yaml") if o["kind"] == "ConfigMap"]
    inventory = build_kube(nodes("t4-gib"), [], Gpushare(), objects={"configmaps": config_maps})
    assert [g.healthy for g in inventory.gpus()] == [True, False]


def test_the_unit_is_inferred_from_the_nodes_as_gpushares_inspect_tool_does() -> None:
    """kubectl-inspect-gpushare (gpushare-device-plugin cmd/inspect/nodeinfo.go setUnit): more than 100
    units per card of the first node with cards is MiB, else GiB; nothing set here."""
    mib = build_kube(nodes("a10-mib"), pods("jupyter-dave"), Gpushare())
    assert [g.memory_bytes for g in mib.gpus()] == [23028 * MiB, 23028 * MiB]
    assert held(mib, 1) == [("jupyter-dave", 8192 * MiB)] and mib.warnings == []
    gib = build_kube(nodes("t4-gib"), pods("jupyter-alice"), Gpushare())
    assert [g.memory_bytes for g in gib.gpus()] == [15 * GiB, 15 * GiB]
    fitted, _ = read(Gpushare(), Listing(nodes("a10-mib"), []))
    assert fitted.render(FOUR_GIB).limits == {"aliyun.com/gpu-mem": "4096"}  # pods ask in the nodes' unit
    assert read(Gpushare(), Listing([], []))[0] == Gpushare(memory_unit="GiB")  # no node: the plugin's default


def test_a_unit_set_wins_over_the_nodes_with_a_warning_when_they_disagree() -> None:
    inventory = build_kube(nodes("a10-mib"), [], Gpushare(memory_unit="GiB"))
    assert [g.memory_bytes for g in inventory.gpus()] == [23028 * GiB, 23028 * GiB]  # as set, however wrong
    (warning,) = inventory.warnings
    assert "set to GiB" in warning and "node a10-mib offers 23028 aliyun.com/gpu-mem per card" in warning
    assert "reads as MiB" in warning
    assert build_kube(nodes("a10-mib"), [], Gpushare(memory_unit="MiB")).warnings == []


def test_memory_unit_mib() -> None:
    """--memory-unit=MiB: capacity and ALIYUN_COM_GPU_MEM_POD are MiB, not GiB."""
    inventory = build_kube(nodes("a10-mib"), pods("jupyter-dave"), Gpushare(memory_unit="MiB"))
    assert [g.memory_bytes for g in inventory.gpus()] == [23028 * MiB, 23028 * MiB]
    # Init containers are not counted: 4096 + 4096 from the containers, as ALIYUN_COM_GPU_MEM_POD says.
    assert held(inventory, 1) == [("jupyter-dave", 8192 * MiB)]


def test_unknown_memory_unit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--memory-unit"):
        Gpushare(memory_unit="GB")


def test_assumed_but_not_assigned_pod_counts() -> None:
    """ASSIGNED "false" (the device plugin has not started the container yet) still holds the card."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-bob"), Gpushare())
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB), ("jupyter-bob", 6 * GiB)]
    assert inventory.nodes[0].gpus[0].free_bytes == 5 * GiB


def test_unbound_pod_with_annotations_does_not_count() -> None:
    """The extender patches then binds; a pod whose bind failed has no node and is not counted."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-grace"), Gpushare())
    assert inventory.allocated_bytes == 0


def test_terminating_pod_is_freed_at_once() -> None:
    """gpushare's IsCompletePod: a deletionTimestamp frees the pod's memory (unlike HAMi)."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-carol"), Gpushare())
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB)]


def test_amount_is_the_pod_annotation() -> None:
    pod = pods("jupyter-alice")[0]
    pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] = "nine"  # Atoi fails: gpushare counts 0
    inventory = build_kube(nodes("t4-gib"), [pod], Gpushare())
    assert held(inventory, 0) == [("jupyter-alice", 0)]
    del pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"]
    assert held(build_kube(nodes("t4-gib"), [pod], Gpushare()), 0) == [("jupyter-alice", 0)]


def test_pod_without_a_gpu_mem_limit_is_not_a_gpushare_pod() -> None:
    pod = pods("jupyter-alice")[0]
    pod["spec"]["containers"][0]["resources"]["limits"] = {}
    assert build_kube(nodes("t4-gib"), [pod], Gpushare()).allocated_bytes == 0


def test_bad_card_index_and_gone_node_are_warnings() -> None:
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-erin", "jupyter-frank"), Gpushare())
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB)]
    assert any("jupyter-erin" in w and "t4-gone" in w for w in inventory.warnings)
    assert any("jupyter-frank" in w and "'first'" in w for w in inventory.warnings)


def test_card_the_node_does_not_have_is_a_warning() -> None:
    pod = pods("jupyter-alice")[0]
    pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "7"
    inventory = build_kube(nodes("t4-gib"), [pod], Gpushare())
    assert inventory.allocated_bytes == 0 and any("card 7" in w for w in inventory.warnings)


def test_gpushare_memory_rounds_up_to_whole_gib() -> None:
    spec = Gpushare().render(GpuRequest(memory_bytes=3 * GiB + 1), Target(card_bytes=V100_16))
    assert spec.limits == {"aliyun.com/gpu-mem": "4"}
    assert spec.annotations == {
        "gpuslice.io/gpu-memory-bytes": str(4 * GiB),
        "gpuslice.io/sharing-backend": "gpushare",
    }
    assert spec.env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert spec.env["GPUSLICE_ISOLATION"] == "none"
    assert spec.warnings == (NO_ISOLATION_WARNING,)


def test_gpushare_counts_a_16gb_card_as_15_gib() -> None:
    assert gpushare_card_units(V100_16) == 15
    # A quarter of 15 GiB rounds down so that four quarters fit on the card.
    assert Gpushare().render(QUARTER, Target(card_bytes=V100_16)).limits == {"aliyun.com/gpu-mem": "3"}


def test_gpushare_with_memory_unit_mib_asks_in_mib() -> None:
    """gpushare's device plugin with --memory-unit=MiB offers one aliyun.com/gpu-mem per MiB."""
    spec = Gpushare(memory_unit="MiB").render(GpuRequest(memory_bytes=4 * GiB + 1))
    assert spec.limits == {"aliyun.com/gpu-mem": "4097"}
    assert spec.annotations["gpuslice.io/gpu-memory-bytes"] == str(4097 * 2**20)
    assert gpushare_card_units(V100_16, "MiB") == V100_16 // 2**20
    quarter = Gpushare(memory_unit="MiB").render(QUARTER, Target(card_bytes=V100_16))
    assert quarter.limits == {"aliyun.com/gpu-mem": str(V100_16 // 2**20 // 4)}
    with pytest.raises(ValueError, match="--memory-unit"):
        Gpushare(memory_unit="GB").render(FOUR_GIB)


def test_gpushare_share_without_a_card_size_asks_for_memory() -> None:
    with pytest.raises(ShareError, match='ask for memory instead, for example "4GiB"'):
        Gpushare().render(QUARTER)


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
    inv = build_kube(nodes, pods, Gpushare())
    gpus = inv.nodes[0].gpus
    assert [g.memory_bytes for g in gpus] == [15 * GiB, 15 * GiB]
    assert gpus[0].allocations == [Allocation("bob", "", 3 * GiB, "b")]
    assert gpus[1].allocations == [Allocation("alice", "", 4 * GiB, "a")]
    assert gpus[1].free_bytes == 11 * GiB
    assert inv.nodes[0].cpu_used_milli == 1000
    assert inv.nodes[0].memory_used_bytes == 2 * GiB
    assert gpus[0].model == "T4"
