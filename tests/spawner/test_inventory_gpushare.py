"""The inventory reads gpushare's annotations and node resources as its own extender counts them.

Fixtures hold the literal strings gpushare writes (tests/spawner/fixtures/gpushare_*.yaml
name the source files and commits they were read from).
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from spawner.backends import Backend
from spawner.inventory import Inventory, build_kube
from spawner.shares import GiB, MiB

FIXTURES = Path(__file__).parent / "fixtures"


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
    inventory = build_kube(nodes("t4-gib"), [], Backend.GPUSHARE)
    assert [g.memory_bytes for g in inventory.gpus()] == [15 * GiB, 15 * GiB]
    assert inventory.nodes[0].gpus[0].model == "Tesla-T4"


def test_unhealthy_configmap_marks_the_card() -> None:
    config_maps = [o for o in items("gpushare_nodes.yaml") if o["kind"] == "ConfigMap"]
    inventory = build_kube(nodes("t4-gib"), [], Backend.GPUSHARE, config_maps=config_maps)
    assert [g.healthy for g in inventory.gpus()] == [True, False]


def test_memory_unit_mib() -> None:
    """--memory-unit=MiB: capacity and ALIYUN_COM_GPU_MEM_POD are MiB, not GiB."""
    inventory = build_kube(nodes("a10-mib"), pods("jupyter-dave"), Backend.GPUSHARE, gpushare_memory_unit="MiB")
    assert [g.memory_bytes for g in inventory.gpus()] == [23028 * MiB, 23028 * MiB]
    # Init containers are not counted: 4096 + 4096 from the containers, as ALIYUN_COM_GPU_MEM_POD says.
    assert held(inventory, 1) == [("jupyter-dave", 8192 * MiB)]


def test_unknown_memory_unit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--memory-unit"):
        build_kube(nodes("a10-mib"), [], Backend.GPUSHARE, gpushare_memory_unit="GB")


def test_assumed_but_not_assigned_pod_counts() -> None:
    """ASSIGNED "false" (the device plugin has not started the container yet) still holds the card."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-bob"), Backend.GPUSHARE)
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB), ("jupyter-bob", 6 * GiB)]
    assert inventory.nodes[0].gpus[0].free_bytes == 5 * GiB


def test_unbound_pod_with_annotations_does_not_count() -> None:
    """The extender patches then binds; a pod whose bind failed has no node and is not counted."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-grace"), Backend.GPUSHARE)
    assert inventory.allocated_bytes == 0


def test_terminating_pod_is_freed_at_once() -> None:
    """gpushare's IsCompletePod: a deletionTimestamp frees the pod's memory (unlike HAMi)."""
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-carol"), Backend.GPUSHARE)
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB)]


def test_amount_is_the_pod_annotation() -> None:
    pod = pods("jupyter-alice")[0]
    pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] = "nine"  # Atoi fails: gpushare counts 0
    inventory = build_kube(nodes("t4-gib"), [pod], Backend.GPUSHARE)
    assert held(inventory, 0) == [("jupyter-alice", 0)]
    del pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"]
    assert held(build_kube(nodes("t4-gib"), [pod], Backend.GPUSHARE), 0) == [("jupyter-alice", 0)]


def test_pod_without_a_gpu_mem_limit_is_not_a_gpushare_pod() -> None:
    pod = pods("jupyter-alice")[0]
    pod["spec"]["containers"][0]["resources"]["limits"] = {}
    assert build_kube(nodes("t4-gib"), [pod], Backend.GPUSHARE).allocated_bytes == 0


def test_bad_card_index_and_gone_node_are_warnings() -> None:
    inventory = build_kube(nodes("t4-gib"), pods("jupyter-alice", "jupyter-erin", "jupyter-frank"), Backend.GPUSHARE)
    assert held(inventory, 0) == [("jupyter-alice", 4 * GiB)]
    assert any("jupyter-erin" in w and "t4-gone" in w for w in inventory.warnings)
    assert any("jupyter-frank" in w and "'first'" in w for w in inventory.warnings)


def test_card_the_node_does_not_have_is_a_warning() -> None:
    pod = pods("jupyter-alice")[0]
    pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "7"
    inventory = build_kube(nodes("t4-gib"), [pod], Backend.GPUSHARE)
    assert inventory.allocated_bytes == 0 and any("card 7" in w for w in inventory.warnings)
