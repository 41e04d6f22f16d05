"""Replay a cluster trace through placement policies (capacity planning, benchmark).

Reads the Alibaba GPU-sharing trace's node and pod lists (the "openb" CSVs) and
replays them the way the ATC'23 FGD paper evaluates a policy: tasks drawn at random
with replacement from the pod list (seeded) arrive one by one and are never removed;
each is placed or fails; arrivals stop once the GPU demand that arrived reaches the
cluster's GPU capacity. GPU amounts are thousandths of a card, as in the trace.

What a policy knows (``Knowledge``): by default what it would know live, the arrivals so
far (``spawner.placement.knowledge``, the code the scheduler extender and the hub use);
``ORACLE`` hands it the whole pod list's popularity before the first arrival, as the FGD
paper assumes.

The CSV readers are the only I/O here; the replay itself is pure.
"""

from __future__ import annotations

import csv
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from bench.stats import percentile
from spawner.placement import Choice, ClusterState, Demand, Informed, Policy, Workload, known_workload, make_policy
from spawner.shares import MiB

MILLI = 1000.0


class TraceError(ValueError):
    """A malformed trace file; the message names the file and line."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TraceTask:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] | None

    @property
    def gpu_demand(self) -> float:
        """In cards: a sharing task asks gpu_milli/1000 of one card, others num_gpu cards."""
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return self.gpu_milli / MILLI
        return float(self.num_gpu)

    def demand(self) -> Demand:
        base = {"cpu_milli": self.cpu_milli, "memory_bytes": self.memory_mib * MiB, "models": self.gpu_spec}
        if self.num_gpu == 0:
            return Demand(**base)  # type: ignore[arg-type]
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return Demand(**base, slice_fraction=self.gpu_milli / MILLI)  # type: ignore[arg-type]
        return Demand(**base, gpus=self.num_gpu)  # type: ignore[arg-type]


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror})") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}; expected {', '.join(required)}")
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise TraceError(f"{path}:{reader.line_num}: expected {len(reader.fieldnames or [])} fields")
            yield reader.line_num, row


def _int(path: Path, line: int, row: dict[str, str], column: str, minimum: int = 0) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} must be a whole number, not {text!r}") from None
    if value < minimum:
        raise TraceError(f"{path}:{line}: {column} must be at least {minimum}, not {value}")
    return value


def read_nodes(path: Path | str) -> list[TraceNode]:
    """The node list; raises TraceError naming the file and line of a malformed row."""
    path = Path(path)
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _int(path, line, row, "gpu")
        model = row["model"].strip()
        if gpus and not model:
            raise TraceError(f"{path}:{line}: a node with GPUs needs a model")
        nodes.append(
            TraceNode(row["sn"], _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib"), gpus, model)
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_tasks(path: Path | str) -> list[TraceTask]:
    """The pod list; raises TraceError naming the file and line of a malformed row."""
    path = Path(path)
    tasks = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if gpu_milli > MILLI:
            raise TraceError(f"{path}:{line}: gpu_milli is thousandths of one card, at most 1000, not {gpu_milli}")
        if num_gpu > 1 and gpu_milli != MILLI:
            raise TraceError(f"{path}:{line}: a task with {num_gpu} GPUs must take whole cards (gpu_milli 1000)")
        if num_gpu and not gpu_milli:
            raise TraceError(f"{path}:{line}: a task with GPUs needs gpu_milli above 0")
        spec = (row.get("gpu_spec") or "").strip()
        tasks.append(
            TraceTask(
                row["name"],
                _int(path, line, row, "cpu_milli"),
                _int(path, line, row, "memory_mib"),
                num_gpu,
                gpu_milli,
                frozenset(spec.split("|")) if spec else None,
            )
        )
    if not tasks:
        raise TraceError(f"{path}: no tasks")
    return tasks


def cluster(nodes: Sequence[TraceNode]) -> ClusterState:
    """Every card is 1000 units, as in the trace."""
    return ClusterState(
        [n.name for n in nodes],
        [n.cpu_milli for n in nodes],
        [n.memory_mib * MiB for n in nodes],
        [[MILLI] * n.gpus for n in nodes],
        [[n.model] * n.gpus for n in nodes],
    )


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    seed: int
    capacity_gpus: float
    allocated_gpus: float
    failed_tasks: int
    arrived_tasks: int
    decision_us: tuple[float, ...]

    @property
    def gpu_allocation_ratio(self) -> float:
        return self.allocated_gpus / self.capacity_gpus if self.capacity_gpus else 0.0

    @property
    def unallocated_gpus(self) -> float:
        return self.capacity_gpus - self.allocated_gpus


def arrivals(tasks: Sequence[TraceTask], capacity_gpus: float, seed: int) -> list[TraceTask]:
    """Tasks drawn with replacement until their GPU demand reaches the capacity."""
    rng = random.Random(seed)
    drawn, demand = [], 0.0
    if not any(t.gpu_demand for t in tasks):
        raise TraceError("the pod list asks for no GPU at all; nothing to replay")
    while demand < capacity_gpus:
        task = tasks[rng.randrange(len(tasks))]
        drawn.append(task)
        demand += task.gpu_demand
    return drawn


PolicyFactory = Callable[[str, Workload | None, int], Policy]


class Knowledge(StrEnum):
    """What a policy knows of the workload when it decides."""

    LIVE = "live"  # the arrivals so far: what the scheduler extender and the hub know
    ORACLE = "oracle"  # the whole pod list's popularity, before the first arrival (the FGD paper's)


def oracle_workload(tasks: Sequence[TraceTask]) -> Workload:
    """The pod list itself: the popularity of each task shape (every shape; each policy keeps as
    many of them as it scores)."""
    return Workload.from_demands((t.demand() for t in tasks), max_types=None)


def replay(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    policy_name: str,
    seed: int,
    make: PolicyFactory = make_policy,
    knowledge: Knowledge = Knowledge.LIVE,
    choices: list[Choice | None] | None = None,
    limit: int | None = None,
) -> ReplayResult:
    """One replay; ``make`` builds the policy (the report passes variants not in POLICIES);
    ``choices``, when given, receives every decision in order (None: no place); ``limit``: only
    the first that many arrivals.

    Live, before each decision the policy is handed ``known_workload`` of the arrivals so far
    (placed or failed: a pod that found no place stays pending, and the extender sees it) and
    the one arriving; that is timed with the decision, as a live decision must compute it too.
    """
    state = cluster(nodes)
    capacity = float(sum(n.gpus for n in nodes))
    arrived = arrivals(tasks, capacity, seed)[:limit]
    live = knowledge is Knowledge.LIVE
    first = known_workload({}, arrived[0].demand()) if live else oracle_workload(tasks)
    policy = make(policy_name, first, seed)
    learner = policy if live and isinstance(policy, Informed) else None
    seen: Counter[Demand] = Counter()
    allocated, failed, timings = 0.0, 0, []
    for task in arrived:
        demand = task.demand()
        start = time.perf_counter_ns()
        if learner is not None:
            learner.know(known_workload(seen, demand))
        choice = policy.choose(state, demand)
        timings.append((time.perf_counter_ns() - start) / 1000)
        seen[demand] += 1
        if choices is not None:
            choices.append(choice)
        if choice is None:
            failed += 1
            continue
        allocated += state.commit(choice, demand)
    return ReplayResult(policy_name, seed, capacity, allocated, failed, len(arrived), tuple(timings))


def summarize(results: Sequence[ReplayResult]) -> dict[str, float | int]:
    """Means over seeds, in the shape `gpuslice bench placement` prints (docs/placement.md)."""
    return {
        "gpu_allocation_ratio": statistics.fmean(r.gpu_allocation_ratio for r in results),
        "unallocated_gpus": statistics.fmean(r.unallocated_gpus for r in results),
        "failed_tasks": round(statistics.fmean(r.failed_tasks for r in results)),
        "decision_us_p50": statistics.fmean(percentile(r.decision_us, 50) for r in results),
        "decision_us_p99": statistics.fmean(percentile(r.decision_us, 99) for r in results),
    }


def bench(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    policies: Sequence[str],
    seeds: int,
    knowledge: Knowledge = Knowledge.LIVE,
) -> dict[str, object]:
    capacity = float(sum(n.gpus for n in nodes))
    return {
        "capacity_gpus": capacity,
        "knowledge": str(knowledge),
        "policies": {
            name: summarize([replay(nodes, tasks, name, seed, knowledge=knowledge) for seed in range(seeds)])
            for name in policies
        },
    }
