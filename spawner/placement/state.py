"""The cluster as numpy arrays, and what a server or task asks of it.

Pure code. The cluster is held as arrays (``ClusterState``) so that one decision over
thousands of GPUs costs a few vectorised passes, not a Python loop per GPU. GPU
amounts are in *units*: bytes on a live platform, thousandths of a card in the
Alibaba trace. A slice is asked for either in units or as a share of a card.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from spawner.inventory import Inventory
from spawner.shares import GpuRequest, RequestKind

EPS = 1e-6
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Demand:
    """What one server or task needs from a node."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    gpus: int = 0  # whole cards
    slice_units: float | None = None  # a slice in the cluster's GPU units
    slice_fraction: float | None = None  # or as a share of the card (0..1)
    models: frozenset[str] | None = None  # allowed GPU models; None: any

    def __hash__(self) -> int:
        # Demands key the counts of the arrivals so far, which a live policy ranks and groups at
        # every decision: hash the fields once (the same value the dataclass would compute).
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            fields = (self.cpu_milli, self.memory_bytes, self.gpus, self.slice_units, self.slice_fraction, self.models)
            cached = hash(fields)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        """Pickled without what is cached on it (``_hash`` and the like): another process hashes
        and orders strings differently."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def cached(self, name: str, compute: Callable[[Demand], object]) -> Any:
        """``compute(self)``, worked out once per demand (a live policy asks at every decision)."""
        value = self.__dict__.get(name)
        if value is None:
            value = compute(self)
            object.__setattr__(self, name, value)
        return value

    @classmethod
    def from_request(
        cls, request: GpuRequest, *, cpu_milli: int = 0, memory_bytes: int = 0, models: Iterable[str] | None = None
    ) -> Demand:
        allowed = frozenset(models) if models else None
        base = cls(cpu_milli=cpu_milli, memory_bytes=memory_bytes, models=allowed)
        if request.kind is RequestKind.WHOLE:
            return replace(base, gpus=request.gpus)
        if request.memory_bytes is not None:
            return replace(base, slice_units=float(request.memory_bytes))
        if request.fraction is not None:
            return replace(base, slice_fraction=request.fraction)
        return base

    @classmethod
    def held(cls, whole: bool, memory_bytes: int) -> Demand:
        """What one held card costs: the whole card, or a slice of its bytes."""
        return cls(gpus=1) if whole else cls(slice_units=float(memory_bytes))

    def request(self) -> GpuRequest:
        """The GPU part as a request, so that words for it come from ``GpuRequest.describe``."""
        if self.gpus:
            return GpuRequest(gpus=self.gpus)
        if self.slice_units:
            return GpuRequest(memory_bytes=int(self.slice_units))
        if self.slice_fraction:
            return GpuRequest(fraction=self.slice_fraction)
        return GpuRequest()

    @property
    def is_slice(self) -> bool:
        return self.gpus == 0 and bool(self.slice_units or self.slice_fraction)

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.is_slice


@dataclass(frozen=True)
class Choice:
    node: int
    gpus: tuple[int, ...]  # empty for a CPU-only demand


class ClusterState:
    """Free resources per node and GPU, as arrays. ``commit`` applies a choice."""

    def __init__(
        self,
        names: Sequence[str],
        cpu_free: Sequence[float],
        memory_free: Sequence[float],
        gpu_capacity: Sequence[Sequence[float]],
        gpu_models: Sequence[Sequence[str]],
        *,
        gpu_free: Sequence[Sequence[float]] | None = None,
        gpu_healthy: Sequence[Sequence[bool]] | None = None,
        node_ok: Sequence[bool] | None = None,
    ) -> None:
        n = len(names)
        width = max((len(row) for row in gpu_capacity), default=0) or 1
        self.names = list(names)
        self.model_names: list[str] = sorted({m for row in gpu_models for m in row})
        model_id = {m: i for i, m in enumerate(self.model_names)}
        self.cpu = np.asarray(cpu_free, dtype=np.float64).reshape(n)
        self.mem = np.asarray(memory_free, dtype=np.float64).reshape(n)
        self.cap = np.zeros((n, width))
        self.free = np.zeros((n, width))
        self.model = np.zeros((n, width), dtype=np.int64)
        self.healthy = np.zeros((n, width), dtype=bool)
        for i, row in enumerate(gpu_capacity):
            k = len(row)
            self.cap[i, :k] = row
            self.free[i, :k] = row if gpu_free is None else gpu_free[i]
            self.model[i, :k] = [model_id[m] for m in gpu_models[i]]
            self.healthy[i, :k] = True if gpu_healthy is None else gpu_healthy[i]
        self.node_ok = np.ones(n, dtype=bool) if node_ok is None else np.asarray(node_ok, dtype=bool)
        self.version = np.zeros(n, dtype=np.int64)  # bumped on every commit to a node

    @classmethod
    def from_inventory(cls, inventory: Inventory) -> ClusterState:
        """GPU units are bytes; unhealthy nodes and GPUs take nothing."""
        nodes = inventory.nodes
        return cls(
            [n.name for n in nodes],
            [n.cpu_free_milli for n in nodes],
            [n.memory_free_bytes for n in nodes],
            [[g.memory_bytes for g in n.gpus] for n in nodes],
            [[g.model for g in n.gpus] for n in nodes],
            gpu_free=[[g.free_bytes for g in n.gpus] for n in nodes],
            gpu_healthy=[[g.healthy for g in n.gpus] for n in nodes],
            node_ok=[n.healthy for n in nodes],
        )

    @property
    def usable(self) -> BoolArray:
        return np.asarray(self.healthy & (self.cap > 0) & self.node_ok[:, None], dtype=bool)

    def allowed(self, models: frozenset[str] | None) -> BoolArray:
        """(N, G): GPUs whose model the demand accepts."""
        if models is None:
            return np.ones(self.model.shape, dtype=bool)
        mask = np.array([m in models for m in self.model_names] or [False], dtype=bool)
        return mask[self.model]

    def need(self, demand: Demand) -> FloatArray:
        """(N, G): units a slice takes on each GPU."""
        if demand.slice_fraction is not None:
            return demand.slice_fraction * self.cap
        return np.full(self.cap.shape, float(demand.slice_units or 0.0))

    def host_fits(self, demand: Demand) -> BoolArray:
        return self.node_ok & (self.cpu >= demand.cpu_milli) & (self.mem >= demand.memory_bytes)

    def slice_candidates(self, demand: Demand) -> BoolArray:
        """(N, G): GPUs the slice fits on."""
        fits = self.usable & self.allowed(demand.models) & (self.free >= self.need(demand) - EPS)
        return fits & self.host_fits(demand)[:, None]

    def full_gpus(self, models: frozenset[str] | None) -> BoolArray:
        return np.asarray(self.usable & self.allowed(models) & (self.free >= self.cap - EPS), dtype=bool)

    def whole_candidates(self, demand: Demand) -> BoolArray:
        """(N,): nodes with enough wholly free GPUs."""
        enough = self.full_gpus(demand.models).sum(axis=1) >= demand.gpus
        return np.asarray(self.host_fits(demand) & enough, dtype=bool)

    def first_full(self, node: int, demand: Demand) -> tuple[int, ...]:
        full = np.flatnonzero(self.full_gpus(demand.models)[node])
        return tuple(int(g) for g in full[: demand.gpus])

    def taken(self, choice: Choice, demand: Demand) -> FloatArray:
        """Units the choice takes from each of its GPUs."""
        gpus = list(choice.gpus)
        if demand.gpus:
            return self.cap[choice.node, gpus]
        return self.need(demand)[choice.node, gpus]

    def commit(self, choice: Choice, demand: Demand) -> float:
        """Apply a choice; return the GPU amount it took, in cards."""
        gpus = list(choice.gpus)
        amount = self.taken(choice, demand)
        cards = float((amount / self.cap[choice.node, gpus]).sum()) if gpus else 0.0
        self.free[choice.node, gpus] -= amount
        self.cpu[choice.node] -= demand.cpu_milli
        self.mem[choice.node] -= demand.memory_bytes
        self.version[choice.node] += 1
        return cards


class Policy(Protocol):
    name: str

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None: ...


def node_gpu_free(state: ClusterState, nodes: IntArray | None = None) -> FloatArray:
    """(N,): free GPU per node in cards (or of ``nodes`` alone: the same values)."""
    if nodes is None:
        usable, free, cap = state.usable, state.free, state.cap
    else:
        usable = state.healthy[nodes] & (state.cap[nodes] > 0) & state.node_ok[nodes, None]
        free, cap = state.free[nodes], state.cap[nodes]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(usable, free / np.where(cap > 0, cap, 1), 0.0)
    return np.asarray(frac.sum(axis=1))


def left_after(state: ClusterState, demand: Demand) -> FloatArray:
    """(N, G): the share of each GPU left free if the slice went there."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray((state.free - state.need(demand)) / np.where(state.cap > 0, state.cap, 1))


def held_demands(inventory: Inventory) -> list[Demand]:
    """The GPU demands the cluster runs now: the workload seen so far."""
    return [Demand.held(a.whole, a.memory_bytes) for _, a in inventory.allocations()]
