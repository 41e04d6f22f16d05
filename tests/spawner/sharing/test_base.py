"""What every sharing backend shares: CPU-only servers, the slice's environment, whole cards, node health,
finished pods, and the table of backends."""

import pytest

from spawner import sharing
from spawner.inventory import holds_resources
from spawner.shares import CPU_ONLY, GiB, GpuRequest, MiB
from spawner.sharing import build_kube
from spawner.sharing.base import Target
from spawner.sharing.gpushare import Gpushare
from spawner.sharing.hami import Hami
from spawner.sharing.mig import Mig
from spawner.sharing.timeslicing import Timeslicing
from spawner.sharing.whole import Whole
from tests.spawner.sharing.objects import node, pod

T4 = 15360 * MiB  # what NVML reports for a 16 GB T4
FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)


@pytest.mark.parametrize("name", list(sharing.BACKENDS))
def test_cpu_only_servers_see_no_gpu_on_every_backend(name: str) -> None:
    spec = sharing.backend(name).render(CPU_ONLY, Target(card_bytes=T4))
    assert spec.env == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    assert spec.limits == {}


def test_slice_env_carries_bytes_and_fraction_when_the_card_is_known() -> None:
    env = Timeslicing().render(FOUR_GIB, Target(card_bytes=16 * GiB)).env
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.250000"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250000"
    assert "GPUSLICE_GPU_MEMORY_FRACTION" not in Timeslicing().render(FOUR_GIB).env


def test_whole_cards_on_every_sharing_backend_ask_for_nvidia_gpu() -> None:
    for backend in (Gpushare(), Hami(), Timeslicing(), Mig(), Whole()):
        assert backend.render(GpuRequest(gpus=2)).limits == {"nvidia.com/gpu": "2"}


def test_builders_return_fresh_dicts() -> None:
    first = Timeslicing().render(FOUR_GIB, Target(card_bytes=16 * GiB))
    first.env["MUTATED"] = "1"
    assert "MUTATED" not in Timeslicing().render(FOUR_GIB, Target(card_bytes=16 * GiB)).env


def test_finished_and_deleting_pods_hold_nothing() -> None:
    nodes = [node("n1", {"aliyun.com/gpu-count": "1", "aliyun.com/gpu-mem": "15"})]
    idx = {"ALIYUN_COM_GPU_MEM_IDX": "0"}
    pods = [
        pod("done", "n1", {"aliyun.com/gpu-mem": "4"}, idx, phase="Succeeded"),
        pod("failed", "n1", {"aliyun.com/gpu-mem": "4"}, idx, phase="Failed"),
        pod("going", "n1", {"aliyun.com/gpu-mem": "4"}, idx, deletionTimestamp="2026-11-22T05:00:00Z"),
        pod("pending", "", {"aliyun.com/gpu-mem": "4"}, phase="Pending"),
    ]
    inv = build_kube(nodes, pods, Gpushare())
    assert inv.allocated_bytes == 0
    assert inv.nodes[0].cpu_used_milli == 0
    assert not holds_resources(pods[0]) and holds_resources(pods[3])


def test_not_ready_or_cordoned_nodes_are_unhealthy() -> None:
    labels = {"nvidia.com/gpu.memory": "16384"}
    nodes = [
        node("down", {"nvidia.com/gpu": "1"}, labels, conditions=[{"type": "Ready", "status": "False"}]),
        node("cordoned", {"nvidia.com/gpu": "1"}, labels, spec={"unschedulable": True}),
        node("up", {"nvidia.com/gpu": "1"}, labels),
    ]
    inv = build_kube(nodes, [], Whole())
    assert [n.healthy for n in inv.nodes] == [False, False, True]
    assert [g.healthy for g in inv.gpus()] == [False, False, True]


def test_the_table_names_each_backend_once_and_refuses_unknown_names_and_settings() -> None:
    # (a test may have added its own backend after these: tests/spawner/sharing/fake.py)
    assert sharing.names(kubernetes=True)[:5] == ["gpushare", "hami", "timeslicing", "mig", "whole"]
    assert "local" not in sharing.names(kubernetes=True)
    assert sharing.names(extender=True)[:3] == ["gpushare", "hami", "whole"]
    assert sharing.backend("gpushare", memory_unit="MiB") == Gpushare(memory_unit="MiB")
    with pytest.raises(sharing.UnknownBackendError, match="use one of gpushare, hami"):
        sharing.backend("vgpu")
    with pytest.raises(sharing.UnknownBackendError, match="no setting memory_units; its settings: memory_unit"):
        sharing.backend("gpushare", memory_units="MiB")
    with pytest.raises(ValueError, match="registered already"):
        sharing.register(type("Other", (Whole,), {"name": "gpushare"}))
