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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from spawner.placement.fragmentation import (
    FitParts,
    Grouping,
    Workload,
    WorkloadArrays,
    bound_demand_per_free_card,
    distinct_gpus,
    expected_overflow,
    gpu_cards,
    host_only_after,
)
from spawner.placement.remembered import Distinct, TypeValues, state_hashes, zeros_in_small_pages
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


@dataclass(frozen=True)
class After:
    """The candidates' node states after placing the task: free units per GPU, CPU, memory, and
    their values per known type (``TypeValues``): fragment, then, for default, places."""

    free: FloatArray
    cpu: FloatArray
    mem: FloatArray
    values: Distinct  # (K, C, known types), each distinct state's once


@dataclass
class FragmentationGradientDescent:
    """FGD: place where the node's expected fragmentation grows least (ties: first).

    ``workload`` is what the policy knows (``spawner.placement.knowledge``); ``know`` hands it a
    new one between decisions (live: the arrivals so far), and what was scored per node state
    and type stays valid across that (``spawner.placement.remembered``).
    """

    workload: Workload
    name: str = "fgd"
    cpu_tasks_fragment: bool = True
    # A type's fragment is what the node leaves unused once filled with its tasks (filled_fragment).
    filled_fragment: bool = False
    filled_host: bool = True  # ... and the node's CPU and memory bound how many it takes
    # The target workload scored: the most popular types of ``workload``, as many as this.
    max_types: int = 64
    remember_states: bool = True  # False: score every candidate state afresh (bench.latency's baseline)
    # The known types (``TypeValues.types``) weighted by the target: 0 for types outside it.
    _arrays: WorkloadArrays | None = field(default=None, init=False, repr=False)
    _values: TypeValues | None = field(default=None, init=False, repr=False)
    _state_id: int = field(default=-1, init=False, repr=False)
    _workload_seen: Workload | None = field(default=None, init=False, repr=False)
    _target: tuple[Demand, ...] = field(default=(), init=False, repr=False)
    _columns: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    # Each node's values per known type now, and how many types of its row are scored
    # (0: changed since, by a commit).
    _now: FloatArray = field(default_factory=lambda: np.zeros((0, 0, 0)), init=False, repr=False)
    _now_known: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    _now_seen: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    _now_generation: int = field(default=-1, init=False, repr=False)
    # The sums over the nodes of ``_now``'s planes of whole numbers (``_whole_planes``), per known
    # type, and each node's free GPU in cards (``node_gpu_free``): kept as rows change.
    _now_total: FloatArray = field(default_factory=lambda: np.zeros((0, 0)), init=False, repr=False)
    _free_cards: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    # A hash of each node's state now (``state_hashes``): nodes in equal states hash alike.
    _now_hash: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    # Each node's row of the remembered table (-1: not known), valid while its ``epoch`` stays.
    _now_slot: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    _now_epoch: int = field(default=-1, init=False, repr=False)

    def know(self, workload: Workload) -> None:
        """Decide from now on against ``workload`` (live: the arrivals so far)."""
        self.workload = workload

    def target(self) -> Workload:
        """The task types fragmentation is measured against."""
        return self.workload.top(self.max_types)

    def _width(self) -> int:
        """Values remembered per node state and type: the fragment."""
        return 1

    def _score(
        self,
        types: WorkloadArrays,
        free: FloatArray,
        cap: FloatArray,
        model: IntArray,
        usable: BoolArray,
        cpu: FloatArray,
        mem: FloatArray,
    ) -> FloatArray:
        """(K, C, T): what ``TypeValues`` remembers per node state and type."""
        return self._from_parts(FitParts.of(types, free, cap, model, usable, cpu, mem))

    def _from_parts(self, parts: FitParts) -> FloatArray:
        frag = parts.fragment(
            cpu_tasks_fragment=self.cpu_tasks_fragment, filled=self.filled_fragment, filled_host=self.filled_host
        )
        return frag[None, :, :]

    def _refresh(self, state: ClusterState) -> FloatArray:
        """Before a decision: the known types weighted by the target, and each node's values now."""
        if self._state_id != id(state) or self._values is None:
            self._values = TypeValues(self._score, self._width(), state.model_names, remember=self.remember_states)
            self._state_id = id(state)
            self._now_generation = -1  # nothing kept of the nodes holds for another state and table
            self._workload_seen, self._target = None, ()
        values = self._values
        if self.workload is not self._workload_seen:
            target = self.target()
            if target.demands != self._target:
                self._columns = values.columns(target.demands)
                self._target = target.demands
            weight = np.zeros(values.known)
            weight[self._columns] = target.weights
            self._arrays = replace(values.types, weight=weight)
            self._workload_seen = self.workload
        return self._per_type_now(state)

    def _per_type_now(self, state: ClusterState) -> FloatArray:
        """(K, N, known): each node's values now; scored only for nodes changed since the last
        decision and types known since."""
        assert self._values is not None
        values = self._values
        n = len(state.names)
        if self._now_generation != values.generation or self._now.shape[1] != n:
            self._now = zeros_in_small_pages((values.width, n, values.max_types))
            self._now_known = np.zeros(n, dtype=np.int64)
            self._now_seen = state.version.copy()
            self._now_generation = values.generation
            self._now_total = np.zeros((values.width, values.max_types))
            self._free_cards = node_gpu_free(state)
            self._now_hash = self._hashes(state, np.arange(n))
            self._now_slot = np.full(n, -1, dtype=np.int64)
        changed = np.flatnonzero(self._now_seen != state.version)
        if changed.size:
            self._now_known[changed] = 0
            self._now_slot[changed] = -1
            self._now_seen[changed] = state.version[changed]
            self._free_cards[changed] = node_gpu_free(state, changed)
            self._now_hash[changed] = self._hashes(state, changed)
        known = values.known
        stale = np.flatnonzero(self._now_known < known)
        if stale.size:
            # Nodes changed since (none of their values hold), then nodes that lack only the types
            # known since (every node, when a type arrives for the first time): those types alone.
            behind = self._now_known[stale]
            for rows in (stale[behind == 0], stale[behind > 0]):
                if rows.size:
                    self._rescore(state, rows, int(self._now_known[rows].min()), known)
        return self._now[:, :, :known]

    def _rescore(self, state: ClusterState, rows: IntArray, since: int, known: int) -> None:
        """The values now of the nodes ``rows``, for the known types from ``since`` on."""
        fresh = self._now_values(state, rows).every(since)
        for plane in self._whole_planes():
            # Whole numbers: the sum changes exactly, and is what summing every node would give.
            before = _finite(self._now[plane, rows, since:known]).sum(axis=0)
            self._now_total[plane, since:known] += _finite(fresh[plane]).sum(axis=0) - before
        self._now[:, rows, since:known] = fresh
        self._now_known[rows] = known

    def _now_values(self, state: ClusterState, rows: IntArray) -> Distinct:
        """The values of the nodes ``rows`` as they are now.

        A type's first arrival has every node scored for it, though no node changed: their rows
        of the remembered table are kept (``_now_slot``), so the nodes' states need not be hashed
        and looked up again (some 1,200 nodes, a third of such a decision; they are about 1% of the
        decisions, at the 99th percentile). The values are those rows either way."""
        assert self._values is not None
        values = self._values
        if not values.remember:
            return self._values_of(state, rows, state.free[rows], state.cpu[rows], state.mem[rows])
        self._forget_rows_of_an_old_table(values)
        kept = self._now_slot[rows]
        if kept.size and kept.min() >= 0:
            slots, first, inverse = np.unique(kept, return_index=True, return_inverse=True)
            at = rows[first]
            of_each = values.at_slots(
                slots, state.free[at], state.cap[at], state.model[at], state.usable[at], state.cpu[at], state.mem[at]
            )
            return Distinct(of_each, inverse.reshape(-1), slots)
        distinct = self._values_of(state, rows, state.free[rows], state.cpu[rows], state.mem[rows])
        self._forget_rows_of_an_old_table(values)  # the table may have started again while scoring these
        if distinct.slots is not None:
            self._now_slot[rows] = distinct.slots[distinct.inverse]
        return distinct

    def _forget_rows_of_an_old_table(self, values: TypeValues) -> None:
        """Drop the nodes' kept rows once the table hands its rows out anew (its ``epoch``)."""
        if self._now_epoch != values.epoch:
            self._now_slot[:] = -1
            self._now_epoch = values.epoch

    def _whole_planes(self) -> tuple[int, ...]:
        """The planes of the remembered values that are whole numbers, summed over the nodes
        (``_now_total``)."""
        return ()

    @staticmethod
    def _hashes(state: ClusterState, nodes: IntArray) -> FloatArray:
        """``state_hashes`` of the nodes' states now."""
        usable = state.healthy[nodes] & (state.cap[nodes] > 0) & state.node_ok[nodes, None]
        cap, model = state.cap[nodes], state.model[nodes]
        return state_hashes(state.free[nodes], cap, model, usable, state.cpu[nodes], state.mem[nodes])[1]

    def _values_of(
        self, state: ClusterState, nodes: IntArray, free: FloatArray, cpu: FloatArray, mem: FloatArray
    ) -> Distinct:
        """(K, C, known): the values of the nodes in the states given (free, cpu, mem)."""
        assert self._values is not None
        return self._values.distinct(free, state.cap[nodes], state.model[nodes], state.usable[nodes], cpu, mem)

    def _frag(self, fragments: FloatArray) -> FloatArray:
        """(C,): the fragmentation of C node states from their fragment per type (C, known)."""
        assert self._arrays is not None
        return np.asarray(fragments @ self._arrays.weight)

    def choose(self, state: ClusterState, demand: Demand) -> Choice | None:
        now = self._refresh(state)
        current = self._frag(now[0])
        if demand.gpus:
            nodes = np.flatnonzero(state.whole_candidates(demand))
            if nodes.size == 0:
                return None
            free = state.free[nodes].copy()
            full = state.full_gpus(demand.models)[nodes]
            # Take the first `gpus` wholly free cards of each candidate node.
            take = full & (np.cumsum(full, axis=1) <= demand.gpus)
            free[take] = 0.0
            after = self._after(state, nodes, free, demand)
            delta = self._frag(after.values.plane(0)) - current[nodes]
            best = int(nodes[self._pick(state, nodes, None, delta, demand, after)])
            return Choice(best, state.first_full(best, demand))
        if not demand.is_slice:
            nodes = np.flatnonzero(state.host_fits(demand))
            if nodes.size == 0:
                return None
            after = self._host_only_after(state, nodes, demand, now)
            delta = self._frag(after.values.plane(0)) - current[nodes]
            return Choice(int(nodes[self._pick(state, nodes, None, delta, demand, after)]), ())
        cand = distinct_gpus(state, state.slice_candidates(demand))
        nodes, gpus = np.nonzero(cand)
        if nodes.size == 0:
            return None
        free = state.free[nodes].copy()
        rows = np.arange(nodes.size)
        free[rows, gpus] -= state.need(demand)[nodes, gpus]
        after = self._after(state, nodes, free, demand)
        delta = self._frag(after.values.plane(0)) - current[nodes]
        best = self._pick(state, nodes, gpus, delta, demand, after)
        return Choice(int(nodes[best]), (int(gpus[best]),))

    def _after(self, state: ClusterState, nodes: IntArray, free: FloatArray, demand: Demand) -> After:
        cpu, mem = state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
        return After(free, cpu, mem, self._values_of(state, nodes, free, cpu, mem))

    def _host_only_after(self, state: ClusterState, nodes: IntArray, demand: Demand, now: FloatArray) -> After:
        """``_after`` for a demand of no GPU, from the candidates' values now (``host_only_after``).

        Every node the task fits is a candidate, and nearly every state after is new (its CPU
        and memory differ): scored in full, they were the costliest decisions, and filled the
        remembered table with states that recur rarely (the table then starts again, and the
        next decisions score afresh what it held). Each distinct state now gives one state after.
        Scoring afresh (``remember_states=False``, the reference the benchmark compares with)
        and ``filled_fragment`` (whose fragment depends on the host's places, not only on fitting
        once) keep scoring them in full.
        """
        if not self.remember_states or self.filled_fragment:
            return self._after(state, nodes, state.free[nodes], demand)
        assert self._values is not None
        cpu, mem = state.cpu[nodes] - demand.cpu_milli, state.mem[nodes] - demand.memory_bytes
        _, first, inverse = np.unique(self._now_hash[nodes], return_index=True, return_inverse=True)
        at = nodes[first]
        values = host_only_after(
            self._values.types, now[:, at], state.free[at], state.cap[at], state.usable[at], cpu[first], mem[first]
        )
        return After(state.free[nodes], cpu, mem, Distinct(values, inverse.reshape(-1)))

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
    """Ours: FGD with four changes, each measured on the Alibaba trace (docs/placement.md).

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
    4. The target workload keeps every GPU shape (cards or slice, allowed models) at its whole
       weight (``keep_every_shape``): live, the workload is the arrivals so far, and the many
       rare model-bound types each fall outside the 64 most popular, so FGD's measure and
       change 3's count of places never saw the cards they need.
    """

    name: str = "default"
    cpu_tasks_fragment: bool = False
    tie_tolerance: float = 0.01
    # Change 4: the target workload keeps every GPU shape at its whole weight (Workload.grouped),
    # not only the most popular types.
    keep_every_shape: bool = True
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
    _grouping: Grouping | None = field(default=None, init=False, repr=False)

    def target(self) -> Workload:
        if not self.keep_every_shape:
            return super().target()
        # Workload.grouped, keeping the grouping while the order of the types stays (live, the
        # arrivals so far change their weights at every decision and their order now and then).
        ranked = self.workload.by_popularity()
        if self._grouping is None or not self._grouping.serves(ranked, self.max_types):
            self._grouping = Grouping.of(ranked.demands, self.max_types)
        return self._grouping.apply(ranked.weights)

    def _counts_places(self) -> bool:
        return self.overflow != "off" or self.lookahead

    def _width(self) -> int:
        """The fragment, and (change 3, lookahead) the tasks of the type the state could take."""
        return 2 if self._counts_places() else 1

    def _whole_planes(self) -> tuple[int, ...]:
        return (1,) if self._counts_places() else ()

    def _from_parts(self, parts: FitParts) -> FloatArray:
        frag = super()._from_parts(parts)
        if not self._counts_places():
            return frag
        return np.concatenate((frag, parts.places()[None, :, :]), axis=0)

    def _pick(
        self,
        state: ClusterState,
        nodes: IntArray,
        gpus: IntArray | None,
        delta: FloatArray,
        demand: Demand,
        after: After,
    ) -> int:
        free_cards = self._free_cards
        node_free = free_cards[nodes]
        tolerance = self.tie_tolerance
        failed = (
            self._expected_failed_gpus(free_cards, nodes, np.ones(nodes.size, dtype=bool), after)
            if self.overflow != "off"
            else np.zeros(nodes.size)
        )
        if self.overflow == "sum":
            delta = delta + failed
        if self.tolerance_per_type and self._arrays is not None:
            # A rare type's fragment enters the sum times its weight: 1% of a card of it is
            # the rarest weight times 1%, and a coarser tolerance would not see it.
            tolerance *= float(self._arrays.weight[self._columns].min())
        tied = np.round(delta / tolerance)
        # Keys least significant first: best-fit, then (a variant) the model bound tasks spare.
        keys = [state.cpu[nodes], node_free] if gpus is None else [node_free, left_after(state, demand)[nodes, gpus]]
        if self.spare_bound_models:
            card = np.zeros(nodes.size, dtype=np.int64) if gpus is None else gpus
            keys.append(self._model_pressure(state)[state.model[nodes, card]])
        if self.lookahead:
            # Expected failed GPU demand, in cards, to the same 1% of a card as the near-ties.
            near_failed = self._expected_failed_gpus(free_cards, nodes, tied == tied.min(), after)
            keys.append(np.round(near_failed / self.tie_tolerance))
        if self.overflow == "first":
            return int(np.lexsort((*keys, tied, np.round(failed / self.tie_tolerance)))[0])
        return int(np.lexsort((*keys, tied))[0])

    def _expected_failed_gpus(
        self, free_cards: FloatArray, nodes: IntArray, near: BoolArray, after: After
    ) -> FloatArray:
        """Per candidate, in cards: the GPU demand of the arrivals still to come that would find no place.

        The arrivals still to come are as many as the cluster's free GPU (``free_cards``, per node)
        can take (free cards over the cards an arrival asks on average), each of a type drawn by
        its popularity, so each type's arrivals are Poisson. A type's places are the tasks of it
        the nodes could take, which placing on a candidate changes only at that node. Scored for
        the candidates ``near`` (change 3: all of them; lookahead: the near-ties, the only ones it
        reorders), and only over the GPU types of the target whose places differ between them;
        the others score 0.
        """
        assert self._arrays is not None
        wl = self._arrays
        cards = gpu_cards(wl)
        gpu_types = self._columns[cards[self._columns] > 0]  # types outside the target weigh 0
        assert self._values is not None
        at = np.flatnonzero(near)
        total = self._now_total[1, gpu_types]  # places in the cluster now
        # A candidate's change of places depends on its node's state now and after: worked out once
        # per distinct pair (hundreds of candidates are some tens of pairs), the same numbers.
        after_of = after.values.inverse[at]
        _, now_of = np.unique(self._now_hash[nodes[at]], return_inverse=True)
        pairs = after_of * (at.size + 1) + now_of.reshape(-1)
        _, first, pair_of = np.unique(pairs, return_index=True, return_inverse=True)
        later = after.values.of_each[1][np.ix_(after_of[first], gpu_types)]
        pair_change = later - self._now[1][np.ix_(nodes[at[first]], gpu_types)]
        low, high = pair_change.min(axis=0), pair_change.max(axis=0)
        arrivals = float(free_cards.sum()) / max(float(wl.weight @ cards), 1e-9)
        mean = arrivals * wl.weight[gpu_types]
        # Types that every candidate leaves the same places, or more than the arrivals could
        # need (the Poisson tail beyond mean + 10 sd + 10 is negligible), score alike: skip them.
        differ = (low < high) & (total + low < mean + 10.0 * np.sqrt(mean) + 10.0)
        score = np.zeros(nodes.size)
        if differ.any():
            # Places are whole numbers, so the sum is exact in any order.
            change = pair_change[pair_of.reshape(-1)]  # (candidates, types)
            left = total[differ][None, :] + change[:, differ]
            score[at] = expected_overflow(mean[differ], left) @ cards[gpu_types[differ]]
        return score

    def _model_pressure(self, state: ClusterState) -> FloatArray:
        """(M,): bound demand per free card of each model."""
        if self._arrays is None:
            return np.zeros(max(len(state.model_names), 1))
        free = np.where(state.usable, state.free / np.where(state.cap > 0, state.cap, 1.0), 0.0)
        per_model = np.bincount(state.model.ravel(), weights=free.ravel(), minlength=len(state.model_names))
        free_cards = per_model.astype(np.float64)
        return bound_demand_per_free_card(self._arrays, free_cards)


POLICIES = ("random-fit", "best-fit", "spread", "dot-product", "fgd", "default")


def make_policy(name: str, workload: Workload | None = None, seed: int = 0, *, once: bool = False) -> Policy:
    """A policy by name; ``fgd`` and ``default`` need the target workload. ``once``: it decides
    once (the extender and the hub make one per decision), so it remembers no node state."""
    if name in {"fgd", "default"}:
        if workload is None:
            raise ValueError(f"policy {name!r} needs a target workload")
        kind = FragmentationGradientDescent if name == "fgd" else DefaultPolicy
        return kind(workload, remember_states=not once)
    simple: dict[str, Policy] = {
        "random-fit": RandomFit(seed),
        "best-fit": BestFit(),
        "spread": Spread(),
        "dot-product": DotProduct(),
    }
    if name not in simple:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {', '.join(POLICIES)}")
    return simple[name]


def _finite(values: FloatArray) -> FloatArray:
    """The values, infinite ones (places of a type that asks for nothing a node runs out of) as 0."""
    return np.where(np.isfinite(values), values, 0.0)
