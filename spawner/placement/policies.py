"""Placement policies: choose a node and GPU(s) for a demand.

* ``random-fit``: any node and GPU that fit, uniformly.
* ``best-fit``: the GPU left with the least free after placing (gpushare's binpack),
  then the node with the least free GPU, then the least free CPU.
* ``spread``: the opposite of best-fit: the emptiest GPU and node.
* ``dot-product``: the node whose free (CPU, memory, GPU) vector is most aligned
  with the demand (Tetris, Grandl et al. SIGCOMM'14), best-fit GPU on it.
* ``fgd``: fragmentation gradient descent (Weng et al., "Beware of Fragmentation",
  USENIX ATC'23): the placement that least increases the node's expected
  fragmentation against the target workload.
* ``default``: ours, fgd with the changes described at ``DefaultPolicy``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from spawner.placement.fragmentation import (
    Workload,
    WorkloadArrays,
    bound_demand_per_free_card,
    distinct_gpus,
    expected_overflow,
    fragmentation,
    gpu_cards,
    row_hash_weights,
    type_capacity,
)
from spawner.placement.state import (
    BoolArray,
    Choice,
    ClusterState,
    Demand,
    FloatArray,
    IntArray,
    Policy,
    left_after,
    node_gpu_free,
)


def _cpu_only_choice(state: ClusterState, demand: Demand, score: FloatArray | None = None) -> Choice | None:
    nodes = np.flatnonzero(state.host_fits(demand))
    if nodes.size == 0:
        return None
    if score is None:
        return Choice(int(nodes[0]), ())
    return Choice(int(nodes[np.argmin(score[nodes])]), ())


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


@dataclass
class BestFit:
    """gpushare's binpack: fill the fullest GPU that still fits, then the fullest node."""

    name: str = "best-fit"
    sign: float = 1.0  # -1 turns it into spread

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        node_free = node_gpu_free(state)
        cpu = state.cpu
        s = self.sign
        if demand.gpus:
            return _ranked_whole(state, demand, [s * node_free, s * cpu])
        if not demand.is_slice:
            return _cpu_only_choice(state, demand, s * cpu)
        return _ranked_slice(state, demand, [s * left_after(state, demand), s * node_free[:, None], s * cpu[:, None]])


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
            + (gpu_demand / gpu_total) * (node_gpu_free(state) / gpu_total)
        )
        if demand.gpus:
            return _ranked_whole(state, demand, [-score])
        if not demand.is_slice:
            return _cpu_only_choice(state, demand, -score)
        return _ranked_slice(state, demand, [-score[:, None], left_after(state, demand)])


# Node states remembered by fgd/default: about 100 bytes each, so at most ~50 MB.
MEMO_STATES = 500_000
# ... or, for a policy that also counts places per type, rows of 65 floats: at most ~50 MB.
CAPACITY_STATES = 100_000


@dataclass(frozen=True)
class After:
    """The candidates' node states after placing the task: free units per GPU, CPU, memory."""

    free: FloatArray
    cpu: FloatArray
    mem: FloatArray


@dataclass
class FragmentationGradientDescent:
    """FGD: place where the node's expected fragmentation grows least (ties: first)."""

    workload: Workload
    name: str = "fgd"
    cpu_tasks_fragment: bool = True
    # A type's fragment is what the node leaves unused once filled with its tasks (filled_fragment).
    filled_fragment: bool = False
    filled_host: bool = True  # ... and the node's CPU and memory bound how many it takes
    # The target workload scored: the most popular types of ``workload``, as many as this.
    max_types: int = 64
    remember_states: bool = True  # False: score every candidate state afresh (bench.latency's baseline)
    _arrays: WorkloadArrays | None = field(default=None, init=False, repr=False)
    _state_id: int = field(default=-1, init=False, repr=False)
    _frag: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    _seen: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    # A node state's fragmentation depends on nothing but that state (and the workload), and
    # one commit changes one node, so the candidate states of the next decision are almost
    # all states scored before: remember them, keyed by the state's exact bytes.
    _memo: dict[bytes, Any] = field(default_factory=dict, init=False, repr=False)
    _last_asked: tuple[Any, ...] = field(default=(), init=False, repr=False)

    def _current(self, state: ClusterState) -> FloatArray:
        """Each node's fragmentation now; recomputed only for nodes changed since last call."""
        if self._state_id != id(state) or self._arrays is None:
            self._arrays = WorkloadArrays.build(self.target(), state.model_names)
            self._memo.clear()
            self._state_id = id(state)
            self._frag = self._frag_of(state, np.arange(len(state.names)))
            self._seen = state.version.copy()
        changed = np.flatnonzero(self._seen != state.version)
        if changed.size:
            self._frag[changed] = self._frag_of(state, changed)
            self._seen[changed] = state.version[changed]
        return self._frag

    def target(self) -> Workload:
        """The task types fragmentation is measured against."""
        return self.workload.top(self.max_types)

    def _frag_of(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None = None,
        cpu: FloatArray | None = None,
        mem: FloatArray | None = None,
    ) -> FloatArray:
        return self._per_state(state, nodes, free, cpu, mem, MEMO_STATES, self._fragmentation)

    def _fragmentation(
        self, free: FloatArray, cap: FloatArray, model: IntArray, usable: BoolArray, cpu: FloatArray, mem: FloatArray
    ) -> FloatArray:
        assert self._arrays is not None
        return fragmentation(
            self._arrays,
            free,
            cap,
            model,
            usable,
            cpu,
            mem,
            cpu_tasks_fragment=self.cpu_tasks_fragment,
            filled=self.filled_fragment,
            filled_host=self.filled_host,
        )

    def _per_state(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None,
        cpu: FloatArray | None,
        mem: FloatArray | None,
        limit: int,
        score: Callable[..., FloatArray],
    ) -> FloatArray:
        """``score`` of each node state (free, cap, model, usable, cpu, mem), one row per node:
        each distinct state scored once, and remembered (up to ``limit`` states)."""
        asked = (nodes, free, cpu, mem)
        if (
            free is not None
            and self._last_asked
            and all(a is b for a, b in zip(asked, self._last_asked[0], strict=True))
        ):
            again: FloatArray = self._last_asked[1]  # the same candidates again, within one decision
            return again
        free = state.free[nodes] if free is None else free
        cpu = state.cpu[nodes] if cpu is None else cpu
        mem = state.mem[nodes] if mem is None else mem
        cap, model, usable = state.cap[nodes], state.model[nodes], state.usable[nodes]
        # Nodes in the same state score the same (common: a cluster has few node
        # shapes and many empty nodes), so score each distinct state once.
        key = np.column_stack((free, cap, model, usable, cpu, mem)).astype(np.float64)
        hashes = key @ row_hash_weights(key.shape[1])
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        rows = np.ascontiguousarray(key[first])
        keys = [row.tobytes() for row in rows]
        memo = self._memo if self.remember_states else {}
        found = [memo.get(k) for k in keys]
        new = [i for i, value in enumerate(found) if value is None]
        if new:
            at = first[new]
            fresh = score(free[at], cap[at], model[at], usable[at], cpu[at], mem[at])
            if len(memo) > limit:
                memo.clear()
            for i, value in zip(new, fresh, strict=True):
                found[i] = value
                memo[keys[i]] = value
        scores = np.asarray(found)[inverse.reshape(-1)]
        self._last_asked = (asked, scores) if asked[1] is not None else ()
        return scores

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
            after = After(free, state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes)
            delta = self._frag_of(state, nodes, after.free, after.cpu, after.mem) - current[nodes]
            best = int(nodes[self._pick(state, nodes, None, delta, demand, after)])
            return Choice(best, state.first_full(best, demand))
        if not demand.is_slice:
            nodes = np.flatnonzero(state.host_fits(demand))
            if nodes.size == 0:
                return None
            after = After(
                state.free[nodes], state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
            )
            delta = self._frag_of(state, nodes, after.free, after.cpu, after.mem) - current[nodes]
            return Choice(int(nodes[self._pick(state, nodes, None, delta, demand, after)]), ())
        cand = distinct_gpus(state, state.slice_candidates(demand))
        nodes, gpus = np.nonzero(cand)
        if nodes.size == 0:
            return None
        free = state.free[nodes].copy()
        rows = np.arange(nodes.size)
        free[rows, gpus] -= state.need(demand)[nodes, gpus]
        after = After(free, state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes)
        delta = self._frag_of(state, nodes, after.free, after.cpu, after.mem) - current[nodes]
        best = self._pick(state, nodes, gpus, delta, demand, after)
        return Choice(int(nodes[best]), (int(gpus[best]),))

    def _pick(
        self,
        state: ClusterState,
        nodes: IntArray,
        gpus: IntArray | None,
        delta: FloatArray,
        demand: Demand,
        after: After,
    ) -> int:
        # Rounding makes ties exact, so the first of equals wins whatever the float noise.
        return int(np.argmin(np.round(delta, 9)))


@dataclass
class DefaultPolicy(FragmentationGradientDescent):
    """Ours: FGD with three changes, each measured on the Alibaba trace (docs/placement.md).

    1. A task that asks for no GPU makes GPUs fragments only where it cannot fit,
       so placing a GPU task weighs the CPUs it leaves for CPU-only tasks.
    2. Candidates whose fragmentation growth differs by less than ``tie_tolerance``
       of a card are ties, and ties go to best-fit (the fuller GPU, then the fuller
       node). FGD alone takes the first of exact ties, which scatters slices over
       empty nodes and strands their CPUs; packing keeps whole nodes free.
    3. Before fragmentation, the candidate after which the arrivals still to come are
       expected to leave the least GPU demand with no place (``overflow``). FGD looks at
       one node at a time: filling the node whose free cards more of the workload cannot
       use looks best even when that node is the only kind a type fits on, and the
       cluster then has no place left for that type. Counting each type's places in the
       whole cluster sees it.
    """

    name: str = "default"
    cpu_tasks_fragment: bool = False
    tie_tolerance: float = 0.01
    keep_every_shape: bool = False  # target workload: Workload.grouped rather than the top types
    # Near-ties go first to the GPU model that model-bound types need least per free card.
    spare_bound_models: bool = False
    # The tolerance applies to each type's share: ``tie_tolerance`` times the rarest type's weight.
    tolerance_per_type: bool = False
    # Lookahead: near-ties go first to the candidate after which the arrivals still to come
    # (drawn from the target workload) leave the least GPU demand with no place.
    lookahead: bool = False
    # Change 3: the same expected failed GPU demand, for every candidate, ranked before the
    # fragmentation growth ("first"), or added to it, both in cards ("sum"); "off": changes 1-2 only.
    overflow: Literal["off", "first", "sum"] = "first"
    _capacity: FloatArray = field(default_factory=lambda: np.zeros((0, 0)), init=False, repr=False)
    _capacity_seen: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    _capacity_state: tuple[int, int] = field(default=(-1, -1), init=False, repr=False)

    def target(self) -> Workload:
        if self.keep_every_shape:
            return self.workload.grouped(self.max_types)
        return super().target()

    def _pick(
        self,
        state: ClusterState,
        nodes: IntArray,
        gpus: IntArray | None,
        delta: FloatArray,
        demand: Demand,
        after: After,
    ) -> int:
        node_free = node_gpu_free(state)[nodes]
        tolerance = self.tie_tolerance
        failed = (
            self._expected_failed_gpus(state, nodes, np.ones(nodes.size, dtype=bool), after)
            if self.overflow != "off"
            else np.zeros(nodes.size)
        )
        if self.overflow == "sum":
            delta = delta + failed
        if self.tolerance_per_type and self._arrays is not None:
            # A rare type's fragment enters the sum times its weight: 1% of a card of it is
            # the rarest weight times 1%, and a coarser tolerance would not see it.
            tolerance *= float(self._arrays.weight.min())
        tied = np.round(delta / tolerance)
        # Keys least significant first: best-fit, then (a variant) the model bound tasks spare.
        keys = [state.cpu[nodes], node_free] if gpus is None else [node_free, left_after(state, demand)[nodes, gpus]]
        if self.spare_bound_models:
            card = np.zeros(nodes.size, dtype=np.int64) if gpus is None else gpus
            keys.append(self._model_pressure(state)[state.model[nodes, card]])
        if self.lookahead:
            # Expected failed GPU demand, in cards, to the same 1% of a card as the near-ties.
            near_failed = self._expected_failed_gpus(state, nodes, tied == tied.min(), after)
            keys.append(np.round(near_failed / self.tie_tolerance))
        if self.overflow == "first":
            return int(np.lexsort((*keys, tied, np.round(failed / self.tie_tolerance)))[0])
        return int(np.lexsort((*keys, tied))[0])

    def _expected_failed_gpus(self, state: ClusterState, nodes: IntArray, near: BoolArray, after: After) -> FloatArray:
        """Per candidate, in cards: the GPU demand of the arrivals still to come that would find no place.

        The arrivals still to come are as many as the cluster's free GPU can take (free cards over
        the cards an arrival asks on average), each of a type drawn by its popularity, so each
        type's arrivals are Poisson. A type's places are the tasks of it the nodes could take,
        which placing on a candidate changes only at that node. Scored for the candidates
        ``near`` (change 3: all of them; lookahead: the near-ties, the only ones it reorders),
        and only over the types whose places differ between them; the others score 0.
        """
        assert self._arrays is not None
        wl = self._arrays
        cards = gpu_cards(wl)
        now = self._capacity_now(state)
        at = np.flatnonzero(near)
        if near.all():  # the very candidates whose fragmentation was just scored
            later = self._capacity_of(state, nodes, after.free, after.cpu, after.mem)
        else:
            later = self._capacity_of(state, nodes[at], after.free[at], after.cpu[at], after.mem[at])
        left = now.sum(axis=0)[None, :] - now[nodes[at]] + later  # (C, T) places after each candidate
        arrivals = float(node_gpu_free(state).sum()) / max(float(wl.weight @ cards), 1e-9)
        mean = arrivals * wl.weight
        # Types that every candidate leaves the same places, or more than the arrivals could
        # need (the Poisson tail beyond mean + 10 sd + 10 is negligible), score alike: skip them.
        differ = (cards > 0) & (left.min(axis=0) < left.max(axis=0))
        differ &= left.min(axis=0) < mean + 10.0 * np.sqrt(mean) + 10.0
        score = np.zeros(nodes.size)
        if differ.any():
            score[at] = expected_overflow(mean[differ], left[:, differ]) @ cards[differ]
        return score

    def _capacity_now(self, state: ClusterState) -> FloatArray:
        """(N, T): the tasks of each type each node could take now; recomputed only for nodes changed since."""
        if self._capacity_state != (id(state), id(self._arrays)):
            self._capacity = self._capacity_of(state, np.arange(len(state.names)))
            self._capacity_seen = state.version.copy()
            self._capacity_state = (id(state), id(self._arrays))
        changed = np.flatnonzero(self._capacity_seen != state.version)
        if changed.size:
            self._capacity[changed] = self._capacity_of(state, changed)
            self._capacity_seen[changed] = state.version[changed]
        return self._capacity

    def _counts_places(self) -> bool:
        return self.overflow != "off" or self.lookahead

    def _frag_of(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None = None,
        cpu: FloatArray | None = None,
        mem: FloatArray | None = None,
    ) -> FloatArray:
        if not self._counts_places():
            return super()._frag_of(state, nodes, free, cpu, mem)
        return self._frag_and_capacity(state, nodes, free, cpu, mem)[:, 0]

    def _capacity_of(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None = None,
        cpu: FloatArray | None = None,
        mem: FloatArray | None = None,
    ) -> FloatArray:
        """(C, T): ``type_capacity`` of the nodes now, or in the states given (free, cpu, mem)."""
        return self._frag_and_capacity(state, nodes, free, cpu, mem)[:, 1:]

    def _frag_and_capacity(
        self,
        state: ClusterState,
        nodes: IntArray,
        free: FloatArray | None,
        cpu: FloatArray | None,
        mem: FloatArray | None,
    ) -> FloatArray:
        """(C, 1 + T): each node state's fragmentation, then its places per type, remembered together:
        the candidates whose fragmentation a decision scores are the ones whose places it counts."""
        arrays = self._arrays
        assert arrays is not None

        def score(
            free: FloatArray, cap: FloatArray, model: IntArray, usable: BoolArray, cpu: FloatArray, mem: FloatArray
        ) -> FloatArray:
            frag = self._fragmentation(free, cap, model, usable, cpu, mem)
            return np.column_stack((frag, type_capacity(arrays, free, cap, model, usable, cpu, mem)))

        return self._per_state(state, nodes, free, cpu, mem, CAPACITY_STATES, score)

    def _model_pressure(self, state: ClusterState) -> FloatArray:
        """(M,): bound demand per free card of each model."""
        if self._arrays is None:
            return np.zeros(max(len(state.model_names), 1))
        free = np.where(state.usable, state.free / np.where(state.cap > 0, state.cap, 1.0), 0.0)
        per_model = np.bincount(state.model.ravel(), weights=free.ravel(), minlength=len(state.model_names))
        free_cards = per_model.astype(np.float64)
        return bound_demand_per_free_card(self._arrays, free_cards)


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
