"""The extender's decisions as pure code: what the policy knows (the pods arrived so far)."""

from collections import Counter
from typing import Any

from spawner.extender import pod_demand, seen_workload
from spawner.placement import Demand, known_workload
from spawner.shares import GiB
from spawner.sharing import backend


def pod(name: str, gib: int, *, node: str = "", phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    limits = {"cpu": "2", "memory": "4Gi", "aliyun.com/gpu-mem": str(gib)}
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_the_extender_knows_the_pods_placed_and_pending_and_the_one_it_places() -> None:
    placed = [pod("a", 4, node="n1"), pod("b", 4, node="n2"), pod("c", 8, node="n1")]
    pending = [pod("d", 12, phase="Pending")]  # no node could take it: it waits, and is seen
    gone = [pod("e", 16, node="n1", phase="Succeeded"), pod("f", 16, node="n2", deleting=True)]
    asking = Demand(cpu_milli=2000, memory_bytes=4 * GiB, slice_units=float(2 * GiB))
    gpushare = backend("gpushare")
    seen = seen_workload([*placed, *pending, *gone], gpushare, asking)
    arrived = Counter(pod_demand(p, gpushare) for p in [*placed, *pending])
    assert seen == known_workload(arrived, asking)
    weights = {d.slice_units: w for d, w in zip(seen.demands, seen.weights, strict=True)}
    assert weights == {4 * GiB: 0.4, 8 * GiB: 0.2, 12 * GiB: 0.2, 2 * GiB: 0.2}  # 16 GiB pods have left
