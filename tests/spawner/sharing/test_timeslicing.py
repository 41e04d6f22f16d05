from spawner.shares import GiB, GpuRequest
from spawner.sharing import build_kube
from spawner.sharing.base import Isolation, Target
from spawner.sharing.timeslicing import Timeslicing
from tests.spawner.sharing.objects import node, pod

FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)


def test_timeslicing_warns_there_is_no_isolation() -> None:
    spec = Timeslicing().render(FOUR_GIB, Target(card_bytes=16 * GiB))
    assert spec.limits == {"nvidia.com/gpu.shared": "1"}
    assert spec.isolation is Isolation.NONE
    assert "without memory isolation" in spec.warnings[0]
    assert Timeslicing(resource="nvidia.com/gpu").render(FOUR_GIB).limits == {"nvidia.com/gpu": "1"}


def test_timeslicing_reads_our_slice_annotation() -> None:
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384", "nvidia.com/gpu.product": "T4"}
    nodes = [node("n1", {"nvidia.com/gpu.shared": "8"}, labels)]
    slice_ = {"gpuslice.io/gpu-memory-bytes": str(4 * GiB)}
    pods = [
        pod("a", "n1", {"nvidia.com/gpu.shared": "1"}, slice_),
        pod("b", "n1", {"nvidia.com/gpu.shared": "1"}, slice_),
    ]
    gpus = build_kube(nodes, pods, Timeslicing()).nodes[0].gpus
    assert len(gpus) == 2
    # Spread over the cards as the device plugin does.
    assert [g.allocated_bytes for g in gpus] == [4 * GiB, 4 * GiB]
