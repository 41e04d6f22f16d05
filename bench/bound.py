"""The limit of placement on a replay: how much of the same arrivals could the same cluster take?

A replay's arrivals (one seed's draw) are fixed, and nothing leaves, so the order they came in
matters only to a policy that must decide as they come. Knowing the whole sequence, a packer
may take them in any order and leave any of them out. Two figures bound what is possible:

* ``relaxation``: a linear program whose optimum no placement can beat (an upper bound on the
  GPU demand admitted, so a lower bound on unallocated GPUs). Tasks of one type are counted
  together, nodes of one kind (cores, memory, cards, model) together; per kind of node the
  tasks' CPU, memory and cards are bounded by the kind's totals, and the cards also through
  dual feasible functions (Fekete and Schepers, 2001: slices of more than half a card take a
  card each, and so on), which the fluid sum alone misses; per type and kind, no more tasks
  than one node takes times the nodes. Its size is types x kinds (about 140 x 15 on the full
  trace cluster), so it is solved at every scale, in milliseconds, with HiGHS.
* ``hindsight``: the best of a few packings made knowing the whole sequence (``PACKINGS``: the
  GPU tasks in an order chosen knowing them all, the hardest to place first, each placed by a
  policy told the exact arrivals): a placement that exists, so at most this many GPUs need be
  left unallocated. CPU-only tasks admit no GPU demand, and a packer in hindsight leaves them out.

The true optimum lies between them. Both are pure code; HiGHS comes with scipy.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog

from bench.placement import MILLI, TraceNode, TraceTask, arrivals, cluster
from spawner.placement import BestFit, DefaultPolicy, FragmentationGradientDescent, Policy, Workload

# Dual feasible functions u^(k), k = 1..DFF_ORDERS (and the identity, the plain card count).
DFF_ORDERS = 10


@dataclass(frozen=True)
class NodeKind:
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TaskType:
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] | None

    @property
    def cards(self) -> float:
        """GPU demand in cards."""
        return self.gpu_milli / MILLI if self.num_gpu == 1 and self.gpu_milli < MILLI else float(self.num_gpu)

    @property
    def is_slice(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    def per_node(self, kind: NodeKind) -> int:
        """How many tasks of this type one empty node of ``kind`` takes, at most (0: none fits)."""
        if self.gpu_spec is not None and kind.model not in self.gpu_spec:
            return 0
        gpu = kind.gpus * int(MILLI // self.gpu_milli) if self.is_slice else kind.gpus // self.num_gpu
        cpu = kind.cpu_milli // self.cpu_milli if self.cpu_milli else gpu
        memory = kind.memory_mib // self.memory_mib if self.memory_mib else gpu
        return int(min(gpu, cpu, memory))


def task_type(task: TraceTask) -> TaskType:
    return TaskType(task.cpu_milli, task.memory_mib, task.num_gpu, task.gpu_milli, task.gpu_spec)


def dff(share: float, order: int) -> float:
    """Fekete and Schepers' u^(k)(x): x where (k+1)x is whole, else floor((k+1)x)/k. For any cards'
    contents, the u of the slices on one card sum to at most 1."""
    scaled = (order + 1) * share
    if abs(scaled - round(scaled)) < 1e-9:
        return share
    return float(np.floor(scaled)) / order


@dataclass(frozen=True)
class Relaxation:
    admitted_gpus: float  # no placement admits more
    variables: int
    constraints: int

    def unallocated(self, capacity: float) -> float:
        return capacity - self.admitted_gpus


def relaxation(nodes: Sequence[TraceNode], arrived: Sequence[TraceTask]) -> Relaxation:
    """The LP bound on the GPU demand any placement of ``arrived`` on ``nodes`` admits.

    A variable per (GPU task type, kind of node it fits on): how many tasks of the type go to
    nodes of the kind. CPU-only tasks are left out: they admit no GPU demand, only take room.
    """
    kinds = Counter(NodeKind(n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes if n.gpus)
    types = Counter(task_type(t) for t in arrived if t.num_gpu)
    pairs = [(t, k, t.per_node(k)) for t in types for k in kinds]
    pairs = [(t, k, most) for t, k, most in pairs if most > 0]
    if not pairs:
        return Relaxation(0.0, 0, 0)
    type_row = {t: i for i, t in enumerate(types)}
    per_kind = 3 + DFF_ORDERS  # CPU, memory, cards, then the cards through each u^(k)
    kind_row = {k: len(types) + j * per_kind for j, k in enumerate(kinds)}
    a = np.zeros((len(types) + len(kinds) * per_kind, len(pairs)))
    b = np.zeros(a.shape[0])
    for t, i in type_row.items():
        b[i] = types[t]  # no more of a type than arrived
    for k, first in kind_row.items():
        b[first : first + per_kind] = [kinds[k] * k.cpu_milli, kinds[k] * k.memory_mib] + [kinds[k] * k.gpus] * (
            1 + DFF_ORDERS
        )
    for column, (t, k, _) in enumerate(pairs):
        a[type_row[t], column] = 1.0
        first = kind_row[k]
        a[first : first + 3, column] = [t.cpu_milli, t.memory_mib, t.cards]
        for order in range(1, DFF_ORDERS + 1):
            a[first + 2 + order, column] = dff(t.cards, order) if t.is_slice else t.cards
    objective = -np.array([t.cards for t, _, _ in pairs])
    caps = [(0.0, float(most * kinds[k])) for _, k, most in pairs]  # as many as the nodes take one by one
    result = linprog(objective, A_ub=a, b_ub=b, bounds=caps, method="highs")
    if result.status != 0:
        raise RuntimeError(f"the relaxation did not solve: {result.message}")
    return Relaxation(float(-result.fun), len(pairs), a.shape[0])


def largest_first(tasks: Sequence[TraceTask]) -> list[TraceTask]:
    """The GPU tasks, the largest GPU demand first (then the most CPU, then the most memory)."""
    return sorted((t for t in tasks if t.num_gpu), key=lambda t: (-t.gpu_demand, -t.cpu_milli, -t.memory_mib))


def hardest_first(tasks: Sequence[TraceTask]) -> list[TraceTask]:
    """The GPU tasks, those bound to GPU models first, and in each group the whole-card tasks
    first, the most cards first; slices last; otherwise in the order they came."""
    gpu = [t for t in tasks if t.num_gpu]
    return sorted(gpu, key=lambda t: (t.gpu_spec is None, -(t.num_gpu if t.gpu_milli >= MILLI else 0)))


def pack(nodes: Sequence[TraceNode], order: Sequence[TraceTask], policy: Policy) -> float:
    """The GPU demand, in cards, that ``policy`` admits taking the GPU tasks in ``order`` (CPU-only
    tasks admit none, and are left out)."""
    state = cluster(nodes)
    admitted = 0.0
    for task in order:
        demand = task.demand()
        choice = policy.choose(state, demand) if task.num_gpu else None
        if choice is not None:
            admitted += state.commit(choice, demand)
    return admitted


@dataclass(frozen=True)
class Hindsight:
    admitted_gpus: float  # a placement that exists admits this much
    packer: str

    def unallocated(self, capacity: float) -> float:
        return capacity - self.admitted_gpus


def hindsight(nodes: Sequence[TraceNode], arrived: Sequence[TraceTask]) -> Hindsight:
    """The best of the packings made knowing the whole sequence (``PACKINGS``)."""
    told = Workload.from_demands((t.demand() for t in arrived), max_types=None)
    found = {name: pack(nodes, order(arrived), policy(told)) for name, (order, policy) in PACKINGS.items()}
    best = max(found, key=lambda name: found[name])
    return Hindsight(found[best], best)


# The packings tried in hindsight: an order of the GPU tasks, and a policy told the exact arrivals.
Order = Callable[[Sequence[TraceTask]], Sequence[TraceTask]]
PACKINGS: dict[str, tuple[Order, Callable[[Workload], Policy]]] = {
    "best-fit, largest first": (largest_first, lambda told: BestFit()),
    "default told the arrivals, hardest first": (hardest_first, DefaultPolicy),
    "fgd told the arrivals, hardest first": (hardest_first, FragmentationGradientDescent),
    "default told the arrivals, as they came": (lambda arrived: arrived, DefaultPolicy),
}


@dataclass(frozen=True)
class Bounds:
    capacity_gpus: float
    relaxation: Relaxation
    hindsight: Hindsight

    @property
    def lowest_unallocated(self) -> float:
        """No placement leaves fewer GPUs unallocated (the relaxation)."""
        return self.relaxation.unallocated(self.capacity_gpus)

    @property
    def hindsight_unallocated(self) -> float:
        """A placement exists that leaves this many (the best packing found in hindsight)."""
        return self.hindsight.unallocated(self.capacity_gpus)


def bounds(nodes: Sequence[TraceNode], arrived: Sequence[TraceTask]) -> Bounds:
    capacity = float(sum(n.gpus for n in nodes))
    return Bounds(capacity, relaxation(nodes, arrived), hindsight(nodes, arrived))


def add_limit(result: dict[str, Any], nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], seeds: int) -> None:
    """Add the limit to ``bench.placement.bench``'s figures (means over the same seeds' arrivals):
    ``limit`` and, per policy, its unallocated GPUs relative to the hindsight packing's."""
    capacity = float(sum(n.gpus for n in nodes))
    found = [bounds(nodes, arrivals(tasks, capacity, seed)) for seed in range(seeds)]
    hindsight_gpus = statistics.fmean(b.hindsight_unallocated for b in found)
    result["limit"] = {
        "relaxation_unallocated_gpus": statistics.fmean(b.lowest_unallocated for b in found),
        "hindsight_unallocated_gpus": hindsight_gpus,
    }
    for figures in result["policies"].values():
        above = figures["unallocated_gpus"] - hindsight_gpus
        figures["unallocated_vs_hindsight"] = above / hindsight_gpus if hindsight_gpus else None
