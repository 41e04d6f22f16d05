from prometheus_client import CollectorRegistry

from hub.metrics import AllocationCollector, register_allocations
from spawner.gpus import simulated_gpus
from spawner.ledger import Held
from spawner.metrics import SPAWN_OFFERED_LINE, SPAWN_REFUSED

GiB = 2**30


def test_allocation_collector_reads_fresh_on_each_scrape() -> None:
    holds = [Held("a/", 1, "a", "", 4 * GiB)]
    registry = CollectorRegistry()
    register_allocations(AllocationCollector("box", lambda: simulated_gpus("2x16GiB:T4"), lambda: holds), registry)
    capacity = registry.get_sample_value(
        "gpuslice_gpu_memory_capacity_bytes", {"node": "box", "gpu": "1", "model": "T4", "simulated": "true"}
    )
    assert capacity == 16 * GiB
    labels = {"node": "box", "gpu": "1", "user": "a", "server": ""}
    assert registry.get_sample_value("gpuslice_gpu_memory_allocated_bytes", labels) == 4 * GiB
    holds.clear()
    assert registry.get_sample_value("gpuslice_gpu_memory_allocated_bytes", labels) is None


def test_a_failing_ledger_drops_only_its_family() -> None:
    def broken() -> list[Held]:
        raise OSError("disk gone")

    registry = CollectorRegistry()
    register_allocations(AllocationCollector("box", lambda: simulated_gpus("1x16GiB"), broken), registry)
    assert (
        registry.get_sample_value(
            "gpuslice_gpu_memory_capacity_bytes", {"node": "box", "gpu": "0", "model": "simulated", "simulated": "true"}
        )
        == 16 * GiB
    )


def test_refusal_reasons_exist_before_the_first_refusal() -> None:
    for counter in (SPAWN_REFUSED, SPAWN_OFFERED_LINE):
        names = {s.labels["reason"] for m in counter.collect() for s in m.samples if s.name.endswith("_total")}
        assert names == {"invalid", "quota", "capacity", "line"}
