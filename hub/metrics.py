"""The hub's collector of GPU allocations, served beside JupyterHub's metrics at /hub/metrics.

The spawners' own counters (refusals) live below the hub, in spawner/metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from spawner.inventory import Gpu
from spawner.ledger import Held
from spawner.patrol import CardHealth


class AllocationCollector(Collector):
    """Capacity and allocated GPU memory per card, read fresh from the ledger on each scrape."""

    def __init__(self, node: str, gpus: Callable[[], Sequence[Gpu]], holds: Callable[[], Iterable[Held]]) -> None:
        self.node, self.gpus, self.holds = node, gpus, holds

    def collect(self) -> Iterable[Metric]:
        capacity = GaugeMetricFamily(
            "gpuslice_gpu_memory_capacity_bytes",
            'GPU memory of each card (simulated cards carry simulated="true").',
            labels=["node", "gpu", "model", "simulated"],
        )
        allocated = GaugeMetricFamily(
            "gpuslice_gpu_memory_allocated_bytes",
            "GPU memory held by each server on each card.",
            labels=["node", "gpu", "user", "server"],
        )
        gpus = self.gpus()
        for gpu in gpus:
            capacity.add_metric(
                [self.node, str(gpu.index), gpu.model, str(gpu.simulated).lower()], float(gpu.memory_bytes)
            )
        yield capacity
        try:
            holds = list(self.holds())
        except Exception:  # a failing source drops its family, never the scrape
            return
        for hold in holds:
            allocated.add_metric([self.node, str(hold.gpu_index), hold.user, hold.server], float(hold.memory_bytes))
        yield allocated


class HomeCollector(Collector):
    """Each user's home folder size and the size it should stay under (hub/homes.py), for HomeOverSize."""

    def __init__(self, sizes: Callable[[], dict[str, int]], limit_of: Callable[[str], int]) -> None:
        self.sizes, self.limit_of = sizes, limit_of

    def collect(self) -> Iterable[Metric]:
        used = GaugeMetricFamily("gpuslice_home_bytes", "Disk taken by each user's home folder.", labels=["user"])
        limit = GaugeMetricFamily(
            "gpuslice_home_limit_bytes", "The size each user's home should stay under (limits.home).", labels=["user"]
        )
        for user, size in sorted(self.sizes().items()):
            used.add_metric([user], float(size))
            limit.add_metric([user], float(self.limit_of(user)))
        yield used
        yield limit


class PatrolCollector(Collector):
    """Each card's last patrol (spawner/patrol.py): healthy or out of placement, and when it was checked."""

    def __init__(self, node: str, health: Callable[[], Iterable[CardHealth]]) -> None:
        self.node, self.health = node, health

    def collect(self) -> Iterable[Metric]:
        healthy = GaugeMetricFamily(
            "gpuslice_patrol_healthy",
            "1 when the card's last patrol passed (or an admin cleared it), 0 when it is out of placement.",
            labels=["node", "gpu"],
        )
        checked = GaugeMetricFamily(
            "gpuslice_patrol_checked_timestamp_seconds", "When the card was last patrolled.", labels=["node", "gpu"]
        )
        try:
            found = list(self.health())
        except Exception:  # a failing source drops its families, never the scrape
            return
        for card in found:
            healthy.add_metric([self.node, str(card.gpu)], 1.0 if card.healthy else 0.0)
            checked.add_metric([self.node, str(card.gpu)], card.checked)
        yield healthy
        yield checked


def register_allocations(collector: Collector, registry: CollectorRegistry = REGISTRY) -> None:
    registry.register(collector)
