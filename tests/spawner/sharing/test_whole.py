import pytest

from spawner.shares import GiB, GpuRequest, ShareError
from spawner.sharing import build_kube
from spawner.sharing.whole import Whole
from tests.spawner.sharing.objects import node, pod

FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)


def test_whole_backend_refuses_slices_with_advice() -> None:
    with pytest.raises(ShareError, match="whole GPUs only; ask for gpus=1"):
        Whole().render(FOUR_GIB)


def test_whole_gpus_take_the_first_free_cards() -> None:
    labels = {"nvidia.com/gpu.product": "A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    nodes = [node("n1", {"nvidia.com/gpu": "4"}, labels)]
    pods = [pod("a", "n1", {"nvidia.com/gpu": "2"}), pod("b", "n1", {"nvidia.com/gpu": "1"}, user="bob")]
    gpus = build_kube(nodes, pods, Whole()).nodes[0].gpus
    assert [bool(g.allocations) for g in gpus] == [True, True, True, False]
    assert gpus[0].allocated_bytes == 80 * GiB and gpus[0].allocations[0].whole
    assert gpus[2].allocations[0].user == "bob"
