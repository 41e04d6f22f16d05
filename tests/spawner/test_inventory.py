import pytest

from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, build_local, cpu_milli
from spawner.shares import GiB


def test_cpu_quantities() -> None:
    assert cpu_milli("2") == 2000
    assert cpu_milli("250m") == 250
    assert cpu_milli("1.5") == 1500


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
