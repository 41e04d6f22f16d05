"""What a placement policy knows when it decides: the arrivals so far. Pure code.

Every caller builds the target workload of ``fgd`` and ``default`` here: the Kubernetes
scheduler extender (``spawner/extender.py``), the hub's own placement (``spawner/mixin.py``,
``spawner/waitline.py``) and the benchmark's replay (``bench/placement.py``), so the
benchmark replays what runs.

Live, a policy knows the demands that have arrived: those placed and still running, those
waiting for a place (a pod the scheduler could not place stays pending, and is seen), and
the one it is placing now. It knows nothing of the arrivals still to come. The benchmark's
oracle mode, the whole pod list's popularity handed over before the first arrival (the FGD
paper's known target workload), is the one caller that gives a policy more, and it is named
as such wherever it is used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from spawner.placement.fragmentation import Workload
from spawner.placement.state import Demand


@runtime_checkable
class Informed(Protocol):
    """A policy that decides against a target workload, and can be handed a new one."""

    def know(self, workload: Workload) -> None: ...


def known_workload(arrived: Mapping[Demand, int], arriving: Demand) -> Workload:
    """The target workload live: every type arrived so far (``arrived``: how many of each, placed
    or waiting) and the one arriving, weighted by how often each arrived. Every type is kept;
    each policy scores as many of the most popular as it was made to (``Workload.top``)."""
    counts = dict(arrived)
    counts[arriving] = counts.get(arriving, 0) + 1
    return Workload.from_counts(counts, max_types=None)


def arrived_counts(demands: Iterable[Demand]) -> Counter[Demand]:
    """How many of each demand arrived: what ``known_workload`` takes."""
    return Counter(demands)
