"""Placement policies: choose a node and GPU(s) for a demand, and explain a refusal.

Pure code. The cluster is held as numpy arrays (``ClusterState``) so that one
decision over thousands of GPUs costs a few vectorised passes, not a Python loop
per GPU. GPU amounts are in *units*: bytes on a live platform, thousandths of a card
in the Alibaba trace. A slice is asked for either in units or as a share of a card.

Policies:

* ``random-fit``: any node and GPU that fit, uniformly.
* ``best-fit``: the GPU left with the least free after placing (gpushare's binpack),
  then the node with the least free GPU, then the least free CPU.
* ``spread``: the opposite of best-fit: the emptiest GPU and node.
* ``dot-product``: the node whose free (CPU, memory, GPU) vector is most aligned
  with the demand (Tetris, Grandl et al. SIGCOMM'14), best-fit GPU on it.
* ``fgd``: fragmentation gradient descent (Weng et al., "Beware of Fragmentation",
  USENIX ATC'23): the placement that least increases the node's expected
  fragmentation against the target workload.
* ``default``: ours, fgd with two changes described at ``DefaultPolicy``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spawner.inventory import Gpu, Inventory, Node
from spawner.shares import GpuRequest, RequestKind, format_bytes

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


# ---------------------------------------------------------------- simple policies


def _cpu_only_choice(state: ClusterState, demand: Demand, score: FloatArray | None = None) -> Choice | None:
    nodes = np.flatnonzero(state.host_fits(demand))
    if nodes.size == 0:
        return None
    if score is None:
        return Choice(int(nodes[0]), ())
    return Choice(int(nodes[np.argmin(score[nodes])]), ())


def _node_gpu_free(state: ClusterState) -> FloatArray:
    """(N,): free GPU per node in cards."""
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(state.usable, state.free / np.where(state.cap > 0, state.cap, 1), 0.0)
    return np.asarray(frac.sum(axis=1))


@dataclass
class RandomFit:
    seed: int = 0
    name: str = "random-fit"
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        if demand.gpus:
            nodes = np.flatnonzero(state.whole_candidates(demand))
            if nodes.size == 0:
                return None
            node = int(nodes[self.rng.randrange(nodes.size)])
            return Choice(node, state.first_full(node, demand))
        if not demand.is_slice:
            nodes = np.flatnonzero(state.host_fits(demand))
            return Choice(int(nodes[self.rng.randrange(nodes.size)]), ()) if nodes.size else None
        cand = state.slice_candidates(demand)
        nodes = np.flatnonzero(cand.any(axis=1))
        if nodes.size == 0:
            return None
        node = int(nodes[self.rng.randrange(nodes.size)])
        gpus = np.flatnonzero(cand[node])
        return Choice(node, (int(gpus[self.rng.randrange(gpus.size)]),))


def _ranked_slice(state: ClusterState, demand: Demand, keys: Sequence[FloatArray]) -> Choice | None:
    """The slice candidate with the smallest keys (first key most significant)."""
    cand = state.slice_candidates(demand)
    nodes, gpus = np.nonzero(cand)
    if nodes.size == 0:
        return None
    columns = [np.broadcast_to(k, cand.shape)[nodes, gpus] for k in keys]
    best = np.lexsort(columns[::-1])[0]
    return Choice(int(nodes[best]), (int(gpus[best]),))


def _ranked_whole(state: ClusterState, demand: Demand, keys: Sequence[FloatArray]) -> Choice | None:
    nodes = np.flatnonzero(state.whole_candidates(demand))
    if nodes.size == 0:
        return None
    best = int(nodes[np.lexsort([k[nodes] for k in keys][::-1])[0]])
    return Choice(best, state.first_full(best, demand))


def _left_after(state: ClusterState, demand: Demand) -> FloatArray:
    """(N, G): the share of each GPU left free if the slice went there."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray((state.free - state.need(demand)) / np.where(state.cap > 0, state.cap, 1))


@dataclass
class BestFit:
    """gpushare's binpack: fill the fullest GPU that still fits, then the fullest node."""

    name: str = "best-fit"
    sign: float = 1.0  # -1 turns it into spread

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        node_free = _node_gpu_free(state)
        cpu = state.cpu
        s = self.sign
        if demand.gpus:
            return _ranked_whole(state, demand, [s * node_free, s * cpu])
        if not demand.is_slice:
            return _cpu_only_choice(state, demand, s * cpu)
        return _ranked_slice(state, demand, [s * _left_after(state, demand), s * node_free[:, None], s * cpu[:, None]])


def Spread() -> BestFit:  # noqa: N802 - a policy constructor, named like the others
    return BestFit(name="spread", sign=-1.0)


@dataclass
class DotProduct:
    """Tetris: maximise demand . free over (CPU, memory, GPU), each scaled to the node's size."""

    name: str = "dot-product"

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        cpu_total = np.maximum(state.cpu.max(), 1.0)
        mem_total = np.maximum(state.mem.max(), 1.0)
        gpu_total = np.maximum(state.cap.sum(axis=1).max() / max(state.cap.max(), 1.0), 1.0)
        gpu_demand = demand.gpus or (demand.slice_fraction or 0.0)
        if demand.slice_units:
            gpu_demand = demand.slice_units / max(float(state.cap.max()), 1.0)
        score = (
            (demand.cpu_milli / cpu_total) * (state.cpu / cpu_total)
            + (demand.memory_bytes / mem_total) * (state.mem / mem_total)
            + (gpu_demand / gpu_total) * (_node_gpu_free(state) / gpu_total)
        )
        if demand.gpus:
            return _ranked_whole(state, demand, [-score])
        if not demand.is_slice:
            return _cpu_only_choice(state, demand, -score)
        return _ranked_slice(state, demand, [-score[:, None], _left_after(state, demand)])


# ---------------------------------------------------------------- fragmentation


@dataclass(frozen=True)
class Workload:
    """The target workload: task types and their popularity (weights sum to 1)."""

    demands: tuple[Demand, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_demands(cls, demands: Iterable[Demand], coverage: float = 1.0, max_types: int = 64) -> Workload:
        """Types by frequency, the most popular first, until ``coverage`` of tasks are covered."""
        counts = Counter(demands)
        total = sum(counts.values())
        if total == 0:
            raise ValueError("a workload needs at least one demand")
        kept: list[tuple[Demand, int]] = []
        covered = 0
        for demand, count in counts.most_common(max_types):
            kept.append((demand, count))
            covered += count
            if covered >= coverage * total:
                break
        weight_sum = sum(c for _, c in kept)
        return cls(tuple(d for d, _ in kept), tuple(c / weight_sum for _, c in kept))


@dataclass
class _WorkloadArrays:
    cpu: FloatArray
    mem: FloatArray
    whole: FloatArray  # whole cards asked (0 for slice and CPU-only types)
    frac: FloatArray  # slice share of a card
    units: FloatArray  # slice in units
    is_slice: BoolArray
    is_cpu: BoolArray
    model_mask: BoolArray  # (M, T): model m acceptable to type t
    weight: FloatArray

    @classmethod
    def build(cls, workload: Workload, model_names: Sequence[str]) -> _WorkloadArrays:
        ds = workload.demands
        mask = np.array(
            [[d.models is None or m in d.models for d in ds] for m in model_names] or [[True] * len(ds)], dtype=bool
        )
        return cls(
            cpu=np.array([d.cpu_milli for d in ds], dtype=np.float64),
            mem=np.array([d.memory_bytes for d in ds], dtype=np.float64),
            whole=np.array([d.gpus for d in ds], dtype=np.float64),
            frac=np.array([d.slice_fraction or 0.0 for d in ds]),
            units=np.array([d.slice_units or 0.0 for d in ds]),
            is_slice=np.array([d.is_slice for d in ds], dtype=bool),
            is_cpu=np.array([not d.uses_gpu for d in ds], dtype=bool),
            model_mask=mask,
            weight=np.array(workload.weights),
        )


def fragmentation(
    wl: _WorkloadArrays,
    free: FloatArray,
    cap: FloatArray,
    model: IntArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
    *,
    cpu_tasks_fragment: bool = True,
) -> FloatArray:
    """Expected GPU fragmentation, in cards, of each of C node states against the workload.

    For a task type t, a node's fragment is the free GPU that t cannot use: all of
    it when t does not fit the node at all (CPU, memory, model or GPU), otherwise
    the free part of each GPU too small for t (for whole-card types, every GPU that is
    not wholly free). For a type that asks for no GPU the paper counts all free GPU as
    fragment; ``cpu_tasks_fragment=False`` counts it only when the task does not fit.
    """
    safe_cap = np.where(cap > 0, cap, 1.0)
    frac = np.where(usable, free / safe_cap, 0.0)  # (C, G)
    total = frac.sum(axis=1)  # (C,)
    allowed = wl.model_mask[model] & usable[:, :, None]  # (C, G, T)
    need = wl.frac[None, None, :] * cap[:, :, None] + wl.units[None, None, :]
    fits = allowed & (free[:, :, None] >= need - EPS)  # GPU holds a slice of type t
    full = allowed & (free >= cap - EPS)[:, :, None]
    slice_frag = np.einsum("cg,cgt->ct", frac, ~fits)
    whole_frag = np.einsum("cg,cgt->ct", frac, ~full)
    slice_fit = fits.any(axis=1)
    whole_fit = full.sum(axis=1) >= wl.whole[None, :]
    host = (cpu[:, None] >= wl.cpu[None, :]) & (mem[:, None] >= wl.mem[None, :])
    gpu_fit = np.where(wl.is_slice[None, :], slice_fit, whole_fit)
    frag = np.where(wl.is_slice[None, :], slice_frag, whole_frag)
    per_type = np.where(host & gpu_fit, frag, total[:, None])
    cpu_value = total[:, None] if cpu_tasks_fragment else np.where(host, 0.0, total[:, None])
    per_type = np.where(wl.is_cpu[None, :], cpu_value, per_type)
    return np.asarray(per_type @ wl.weight)


@dataclass
class FragmentationGradientDescent:
    """FGD: place where the node's expected fragmentation grows least (ties: first)."""

    workload: Workload
    name: str = "fgd"
    cpu_tasks_fragment: bool = True
    _arrays: _WorkloadArrays | None = field(default=None, init=False, repr=False)
    _state_id: int = field(default=-1, init=False, repr=False)
    _frag: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    _seen: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)

    def _current(self, state: ClusterState) -> FloatArray:
        """Each node's fragmentation now; recomputed only for nodes changed since last call."""
        if self._state_id != id(state) or self._arrays is None:
            self._arrays = _WorkloadArrays.build(self.workload, state.model_names)
            self._state_id = id(state)
            self._frag = self._frag_of(state, np.arange(len(state.names)))
            self._seen = state.version.copy()
        changed = np.flatnonzero(self._seen != state.version)
        if changed.size:
            self._frag[changed] = self._frag_of(state, changed)
            self._seen[changed] = state.version[changed]
        return self._frag

    def _frag_of(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None = None,
        cpu: FloatArray | None = None,
        mem: FloatArray | None = None,
    ) -> FloatArray:
        assert self._arrays is not None
        free = state.free[nodes] if free is None else free
        cpu = state.cpu[nodes] if cpu is None else cpu
        mem = state.mem[nodes] if mem is None else mem
        cap, model, usable = state.cap[nodes], state.model[nodes], state.usable[nodes]
        # Nodes in the same state score the same (common: a cluster has few node
        # shapes and many empty nodes), so score each distinct state once.
        key = np.column_stack((free, cap, model, usable, cpu, mem)).astype(np.float64)
        hashes = key @ _row_hash_weights(key.shape[1])
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        scores = fragmentation(
            self._arrays,
            free[first],
            cap[first],
            model[first],
            usable[first],
            cpu[first],
            mem[first],
            cpu_tasks_fragment=self.cpu_tasks_fragment,
        )
        return np.asarray(scores[inverse.reshape(-1)])

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        current = self._current(state)
        if demand.gpus:
            nodes = np.flatnonzero(state.whole_candidates(demand))
            if nodes.size == 0:
                return None
            free = state.free[nodes].copy()
            full = state.full_gpus(demand.models)[nodes]
            # Take the first `gpus` wholly free cards of each candidate node.
            take = full & (np.cumsum(full, axis=1) <= demand.gpus)
            free[take] = 0.0
            delta = (
                self._frag_of(
                    state, nodes, free, state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
                )
                - current[nodes]
            )
            best = int(nodes[self._pick(state, nodes, None, delta, demand)])
            return Choice(best, state.first_full(best, demand))
        if not demand.is_slice:
            nodes = np.flatnonzero(state.host_fits(demand))
            if nodes.size == 0:
                return None
            delta = (
                self._frag_of(
                    state, nodes, None, state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
                )
                - current[nodes]
            )
            return Choice(int(nodes[self._pick(state, nodes, None, delta, demand)]), ())
        cand = _distinct(state, state.slice_candidates(demand))
        nodes, gpus = np.nonzero(cand)
        if nodes.size == 0:
            return None
        free = state.free[nodes].copy()
        rows = np.arange(nodes.size)
        free[rows, gpus] -= state.need(demand)[nodes, gpus]
        delta = (
            self._frag_of(
                state, nodes, free, state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
            )
            - current[nodes]
        )
        best = self._pick(state, nodes, gpus, delta, demand)
        return Choice(int(nodes[best]), (int(gpus[best]),))

    def _pick(
        self, state: ClusterState, nodes: IntArray, gpus: IntArray | None, delta: FloatArray, demand: Demand
    ) -> int:
        # Rounding makes ties exact, so the first of equals wins whatever the float noise.
        return int(np.argmin(np.round(delta, 9)))


def _row_hash_weights(width: int) -> FloatArray:
    """Fixed random weights: equal rows get equal hashes, distinct rows (almost surely) not."""
    if width not in _HASH_WEIGHTS:
        _HASH_WEIGHTS[width] = np.random.default_rng(width).uniform(1.0, 2.0, width)
    return _HASH_WEIGHTS[width]


_HASH_WEIGHTS: dict[int, FloatArray] = {}


def _distinct(state: ClusterState, cand: BoolArray) -> BoolArray:
    """Drop candidate GPUs equal (free, size, model) to an earlier candidate on the same node."""
    same = (
        (state.free[:, :, None] == state.free[:, None, :])
        & (state.cap[:, :, None] == state.cap[:, None, :])
        & (state.model[:, :, None] == state.model[:, None, :])
        & cand[:, None, :]
    )
    earlier = np.tril(np.ones((cand.shape[1], cand.shape[1]), dtype=bool), k=-1)
    return np.asarray(cand & ~(same & earlier).any(axis=2), dtype=bool)


@dataclass
class DefaultPolicy(FragmentationGradientDescent):
    """Ours: FGD with two changes, each measured on the Alibaba trace (docs/placement.md).

    1. A task that asks for no GPU makes GPUs fragments only where it cannot fit,
       so placing a GPU task weighs the CPUs it leaves for CPU-only tasks.
    2. Candidates whose fragmentation growth differs by less than ``tie_tolerance``
       of a card are ties, and ties go to best-fit (the fuller GPU, then the fuller
       node). FGD alone takes the first of exact ties, which scatters slices over
       empty nodes and strands their CPUs; packing keeps whole nodes free.
    """

    name: str = "default"
    cpu_tasks_fragment: bool = False
    tie_tolerance: float = 0.01

    def _pick(
        self, state: ClusterState, nodes: IntArray, gpus: IntArray | None, delta: FloatArray, demand: Demand
    ) -> int:
        node_free = _node_gpu_free(state)[nodes]
        tied = np.round(delta / self.tie_tolerance)
        if gpus is None:
            return int(np.lexsort((state.cpu[nodes], node_free, tied))[0])
        left = _left_after(state, demand)[nodes, gpus]
        return int(np.lexsort((node_free, left, tied))[0])


POLICIES = ("random-fit", "best-fit", "spread", "dot-product", "fgd", "default")


def make_policy(name: str, workload: Workload | None = None, seed: int = 0) -> Policy:
    """A policy by name; ``fgd`` and ``default`` need the target workload."""
    if name in {"fgd", "default"}:
        if workload is None:
            raise ValueError(f"policy {name!r} needs a target workload")
        return FragmentationGradientDescent(workload) if name == "fgd" else DefaultPolicy(workload)
    simple: dict[str, Policy] = {
        "random-fit": RandomFit(seed),
        "best-fit": BestFit(),
        "spread": Spread(),
        "dot-product": DotProduct(),
    }
    if name not in simple:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {', '.join(POLICIES)}")
    return simple[name]


# ---------------------------------------------------------------- explanations


@dataclass(frozen=True)
class Explanation:
    """Why a demand does not fit now, in words, plus the numbers behind them."""

    summary: str
    reasons: tuple[str, ...]
    largest_free_bytes: int
    largest_free_where: str
    free_cards: int
    suggestion: str

    def __str__(self) -> str:
        return " ".join((self.summary, *self.reasons, self.suggestion)).strip()


def explain(demand: Demand, inventory: Inventory, asked: str = "") -> Explanation:
    """Say why nothing fits ``demand``: the largest free slice and where, how many cards
    are wholly free, which constraint ruled out the rest, and what would start now."""
    asked = asked or _describe(demand)
    reasons: Counter[str] = Counter()
    best_bytes, best_where, best_cards = 0, "", 0
    for node in inventory.nodes:
        if not node.healthy:
            reasons["node"] += len(node.gpus) or 1
            continue
        short = _host_shortfall(node, demand)
        eligible = []
        for gpu in node.gpus:
            if not gpu.healthy:
                reasons["unhealthy"] += 1
            elif demand.models is not None and gpu.model not in demand.models:
                reasons["model"] += 1
            elif short:
                reasons[short] += 1
            else:
                eligible.append(gpu)
        if short and not node.gpus and not demand.uses_gpu:
            reasons[short] += 1
        for gpu in eligible:
            if gpu.free_bytes > best_bytes:
                best_bytes, best_where = gpu.free_bytes, f"{node.name} GPU {gpu.index} ({gpu.model})"
        best_cards = max(best_cards, sum(1 for g in eligible if g.is_free))
        reasons["too-small"] += sum(1 for g in eligible if not _gpu_holds(g, demand))
    texts = _reason_texts(reasons, demand)
    return Explanation(
        summary=f"Nothing can hold {asked} right now.",
        reasons=tuple(texts),
        largest_free_bytes=best_bytes,
        largest_free_where=best_where,
        free_cards=best_cards,
        suggestion=_suggestion(demand, best_bytes, best_where, best_cards),
    )


def _describe(demand: Demand) -> str:
    if demand.gpus:
        return f"{demand.gpus} whole GPU{'s' if demand.gpus > 1 else ''}"
    if demand.slice_units:
        return f"{format_bytes(demand.slice_units)} of one GPU"
    if demand.slice_fraction:
        return f"{demand.slice_fraction:g} of one GPU"
    return "a CPU-only server"


def _host_shortfall(node: Node, demand: Demand) -> str:
    if node.cpu_free_milli < demand.cpu_milli:
        return "cpu"
    if node.memory_free_bytes < demand.memory_bytes:
        return "memory"
    return ""


def _gpu_holds(gpu: Gpu, demand: Demand) -> bool:
    if demand.gpus:
        return gpu.is_free
    need = demand.slice_units if demand.slice_units else (demand.slice_fraction or 0.0) * gpu.memory_bytes
    return gpu.free_bytes >= need - EPS


def _reason_texts(reasons: Counter[str], demand: Demand) -> list[str]:
    texts = []
    if reasons["model"]:
        allowed = ", ".join(sorted(demand.models or ()))
        texts.append(f"{_gpus(reasons['model'])} of another model (this server needs {allowed}).")
    if reasons["cpu"]:
        texts.append(f"{_gpus(reasons['cpu'])} on machines without {demand.cpu_milli / 1000:g} free CPUs.")
    if reasons["memory"]:
        texts.append(f"{_gpus(reasons['memory'])} on machines without {format_bytes(demand.memory_bytes)} free memory.")
    if reasons["unhealthy"] or reasons["node"]:
        texts.append(f"{_gpus(reasons['unhealthy'] + reasons['node'])} out of service.")
    if reasons["too-small"]:
        what = "already partly in use" if demand.gpus else "without enough free memory"
        texts.append(f"{_gpus(reasons['too-small'])} {what}.")
    return texts


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''} {'is' if n == 1 else 'are'}"


def _suggestion(demand: Demand, best_bytes: int, best_where: str, best_cards: int) -> str:
    if demand.gpus:
        if best_cards:
            are = "GPUs are" if best_cards > 1 else "GPU is"
            return f"{best_cards} whole {are} free on one machine: ask for gpus={best_cards} to start now."
        if best_bytes:
            return (
                f"No whole GPU is free; the largest free slice is {format_bytes(best_bytes)} on {best_where}: "
                "ask for that or less to start now."
            )
        return "No GPU is free: try again when someone stops a server, or ask for a CPU-only server."
    if best_bytes:
        return (
            f"The largest free slice is {format_bytes(best_bytes)} on {best_where}: ask for that or less to start now."
        )
    if demand.uses_gpu:
        return "No GPU memory is free: try again when someone stops a server, or ask for a CPU-only server."
    return "Try again when a machine has room."
