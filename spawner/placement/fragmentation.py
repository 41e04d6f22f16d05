"""The fragmentation model of FGD (Weng et al., "Beware of Fragmentation", ATC'23).

A node's fragmentation is the free GPU that the target workload's task types cannot
use, weighted by how popular each type is. Pure code over ``ClusterState`` arrays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from spawner.placement.state import EPS, BoolArray, ClusterState, Demand, FloatArray, IntArray


@dataclass(frozen=True)
class Workload:
    """The target workload: task types and their popularity (weights sum to 1)."""

    demands: tuple[Demand, ...]
    weights: tuple[float, ...]
    # Already most popular first (as ``from_counts`` makes it), so ``top`` need not sort.
    ranked: bool = field(default=False, compare=False)

    @classmethod
    def from_demands(cls, demands: Iterable[Demand], coverage: float = 1.0, max_types: int | None = 64) -> Workload:
        """Types by frequency, the most popular first, until ``coverage`` of tasks are covered
        (and at most ``max_types`` of them; None keeps every type)."""
        return cls.from_counts(Counter(demands), coverage, max_types)

    @classmethod
    def from_counts(cls, counts: Mapping[Demand, int], coverage: float = 1.0, max_types: int | None = 64) -> Workload:
        """As ``from_demands``, from how many times each demand was seen."""
        total = sum(counts.values())
        if total == 0:
            raise ValueError("a workload needs at least one demand")
        # Most popular first; equal counts in a fixed order, so that the same demands in any
        # arrival order make the same workload (and the same floating-point sums).
        ranked = sorted(counts.items(), key=_popular_first)
        kept = ranked  # every type (live, at every decision: no loop to run)
        if max_types is not None or coverage < 1.0:
            kept, covered = [], 0
            for demand, count in ranked[:max_types]:
                kept.append((demand, count))
                covered += count
                if covered >= coverage * total:
                    break
        weight_sum = sum(c for _, c in kept)
        return cls(tuple(d for d, _ in kept), tuple(c / weight_sum for _, c in kept), ranked=True)

    def top(self, max_types: int) -> Workload:
        """The ``max_types`` most popular types, their weights scaled to sum to 1 again."""
        if len(self.demands) <= max_types:
            return self
        pairs = zip(self.weights, self.demands, strict=True)
        ranked = list(pairs) if self.ranked else sorted(pairs, key=lambda wd: (-wd[0], rank_key(wd[1])))
        kept = ranked[:max_types]
        weight_sum = sum(w for w, _ in kept)
        return Workload(tuple(d for _, d in kept), tuple(w / weight_sum for w, _ in kept), ranked=True)

    def by_popularity(self) -> Workload:
        """The same types and weights, the most popular first (equal weights in ``rank_key`` order)."""
        if self.ranked:
            return self
        ranked = sorted(zip(self.weights, self.demands, strict=True), key=lambda wd: (-wd[0], rank_key(wd[1])))
        return Workload(tuple(d for _, d in ranked), tuple(w for w, _ in ranked), ranked=True)

    def grouped(self, max_types: int) -> Workload:
        """At most ``max_types`` types (more only where there are more GPU shapes) that keep the
        weight of every GPU shape: the GPU part and allowed models, which decide what a node's
        free GPU can take. CPU and memory vary within a shape and matter less: each shape keeps
        its most popular type, the slots left go to the next most popular types, and every type
        left out adds its weight to the most popular kept type of its shape (``Grouping``).
        """
        ranked = self.by_popularity()
        return Grouping.of(ranked.demands, max_types).apply(ranked.weights)


@dataclass(frozen=True)
class Grouping:
    """Which types ``Workload.grouped`` keeps, and which kept type takes each type's weight.

    It depends on the order of the types alone, not on their weights: live, the arrivals so far
    change the weights at every decision and their order now and then, so a policy keeps the
    grouping while the order stays (``DefaultPolicy.target``).
    """

    ranked: tuple[Demand, ...]  # the types, the most popular first
    max_types: int
    into: IntArray  # (T,): the place in ``ranked`` of the kept type that takes each type's weight
    kept: IntArray  # the places in ``ranked`` of the kept types, in that order
    demands: tuple[Demand, ...]  # the kept types

    @classmethod
    def of(cls, ranked: tuple[Demand, ...], max_types: int) -> Grouping:
        shapes = [gpu_shape(demand) for demand in ranked]
        # By place in ``ranked`` (the types are distinct): no demand hashed in the loops below.
        head: dict[object, int] = {}  # each shape's most popular type
        for i, shape in enumerate(shapes):
            head.setdefault(shape, i)
        kept = set(head.values())
        for i in range(len(ranked)):
            if len(kept) >= max_types:
                break
            kept.add(i)
        into = np.array([i if i in kept else head[shape] for i, shape in enumerate(shapes)], dtype=np.int64)
        # Kept types in the order ranked (a shape's head comes before the types it stands for).
        places = np.array(sorted(kept), dtype=np.int64)
        return cls(ranked, max_types, into, places, tuple(ranked[i] for i in places))

    def serves(self, ranked: Workload, max_types: int) -> bool:
        """Whether this is the grouping of ``ranked`` (types the most popular first)."""
        return ranked.ranked and max_types == self.max_types and ranked.demands == self.ranked

    def apply(self, weights: Sequence[float]) -> Workload:
        """The grouped workload of the types ``ranked`` with these weights."""
        # bincount adds in the order of the types, as a loop over them would: the same sums.
        summed = np.bincount(self.into, weights=np.asarray(weights, dtype=np.float64), minlength=len(self.ranked))
        return Workload(self.demands, tuple(summed[self.kept].tolist()))


def _popular_first(item: tuple[Demand, int]) -> tuple[int, str]:
    """The sort key of ``Workload.from_counts``: the count, most first, then ``rank_key``."""
    return -item[1], rank_key(item[0])


def rank_key(demand: Demand) -> str:
    """The order of types equally popular: their text, worked out once per demand (a live
    policy ranks the arrivals so far at every decision)."""
    text: str = demand.cached("_rank_key", repr)
    return text


def gpu_shape(demand: Demand) -> tuple[object, ...]:
    """What of a demand decides which free GPU it can use: cards or slice, and allowed models."""
    shape: tuple[object, ...] = demand.cached("_gpu_shape", _gpu_shape)
    return shape


def _gpu_shape(demand: Demand) -> tuple[object, ...]:
    models = tuple(sorted(demand.models)) if demand.models else ()
    return (demand.gpus, demand.slice_fraction, demand.slice_units, models)


@dataclass
class WorkloadArrays:
    cpu: FloatArray
    mem: FloatArray
    whole: FloatArray  # whole cards asked (0 for slice and CPU-only types)
    frac: FloatArray  # slice share of a card
    units: FloatArray  # slice in units
    is_slice: BoolArray
    is_cpu: BoolArray
    model_mask: BoolArray  # (M, T): model m acceptable to type t
    weight: FloatArray
    # gpu_shapes of these types, worked out once (the arrays are not changed once built).
    _shapes: tuple[WorkloadArrays, IntArray] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, workload: Workload, model_names: Sequence[str]) -> WorkloadArrays:
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

    def subset(self, columns: IntArray, weight: FloatArray | None = None) -> WorkloadArrays:
        """The types at ``columns``, in that order, with these weights (default: their own)."""
        return WorkloadArrays(
            cpu=self.cpu[columns],
            mem=self.mem[columns],
            whole=self.whole[columns],
            frac=self.frac[columns],
            units=self.units[columns],
            is_slice=self.is_slice[columns],
            is_cpu=self.is_cpu[columns],
            model_mask=self.model_mask[:, columns],
            weight=self.weight[columns] if weight is None else weight,
        )


def fragmentation(
    wl: WorkloadArrays,
    free: FloatArray,
    cap: FloatArray,
    model: IntArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
    *,
    cpu_tasks_fragment: bool = True,
    filled: bool = False,
    filled_host: bool = True,
) -> FloatArray:
    """Expected GPU fragmentation, in cards, of each of C node states against the workload:
    ``type_fragment`` weighted by each type's popularity."""
    per_type = type_fragment(
        wl,
        free,
        cap,
        model,
        usable,
        cpu,
        mem,
        cpu_tasks_fragment=cpu_tasks_fragment,
        filled=filled,
        filled_host=filled_host,
    )
    return np.asarray(per_type @ wl.weight)


def type_fragment(
    wl: WorkloadArrays,
    free: FloatArray,
    cap: FloatArray,
    model: IntArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
    *,
    cpu_tasks_fragment: bool = True,
    filled: bool = False,
    filled_host: bool = True,
) -> FloatArray:
    """(C, T): each node state's fragment for each task type, in cards.

    For a task type t, a node's fragment is the free GPU that t cannot use: all of
    it when t does not fit the node at all (CPU, memory, model or GPU), otherwise
    the free part of each GPU too small for t (for whole-card types, every GPU that is
    not wholly free). For a type that asks for no GPU the paper counts all free GPU as
    fragment; ``cpu_tasks_fragment=False`` counts it only when the task does not fit.
    A type's fragment depends on the node state and that type alone, not on the other
    types or their popularity, so it can be remembered per type.

    ``filled=True`` counts, for a GPU type, the free GPU that tasks of t cannot use when
    the node takes as many of them as it can, one after another (``filled_fragment``),
    rather than what one task of t cannot use.
    """
    parts = FitParts.of(wl, free, cap, model, usable, cpu, mem)
    return parts.fragment(cpu_tasks_fragment=cpu_tasks_fragment, filled=filled, filled_host=filled_host)


def type_capacity(
    wl: WorkloadArrays,
    free: FloatArray,
    cap: FloatArray,
    model: IntArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
) -> FloatArray:
    """(C, T): how many tasks of type t each of C node states could still take, one after another.

    A slice type: the slices that fit on its GPUs side by side; a whole-card type: its free
    cards over the cards it asks; both bounded by the CPU and memory. A type asking for no
    GPU: the CPU and memory alone.
    """
    return FitParts.of(wl, free, cap, model, usable, cpu, mem).places()


@dataclass
class FitParts:
    """What fragments and places are made of, for C node states and T task types.

    The GPU side is worked out once per GPU *shape* (cards or slice, allowed models: S of them,
    far fewer than the types, which differ mostly in CPU and memory), then spread to the types;
    the host side (CPU, memory) per type. Slice shapes come first (``slices`` of them): which
    cards hold a slice matters only to them, which cards are wholly free only to the others.
    What one GPU can take of each shape is worked out once per *distinct* GPU (``DistinctGpus``)
    and spread to the GPUs: hundreds of new node states are some tens of distinct GPUs.
    """

    wl: WorkloadArrays
    shape: IntArray  # (T,): each type's GPU shape
    shapes: WorkloadArrays  # the S shapes, slices first (CPU and memory those of one type each: unused)
    slices: int
    free: FloatArray
    cap: FloatArray
    frac: FloatArray  # (C, G): each usable GPU's free share of its card
    total: FloatArray  # (C,): free GPU in cards
    gpus: DistinctGpus  # the distinct GPUs of the C states, and what each takes of each shape
    host: BoolArray  # (C, T): CPU and memory fit
    gpu_fit: BoolArray  # (C, S): the slice fits a GPU, or enough cards are wholly free
    cpu: FloatArray
    mem: FloatArray

    @classmethod
    def of(
        cls,
        wl: WorkloadArrays,
        free: FloatArray,
        cap: FloatArray,
        model: IntArray,
        usable: BoolArray,
        cpu: FloatArray,
        mem: FloatArray,
    ) -> FitParts:
        shapes, shape = gpu_shapes(wl)
        slices = int(shapes.is_slice.sum())
        frac = _free_share(free, cap, usable)
        gpus = DistinctGpus.of(shapes, slices, free, cap, model, usable)
        # Whole numbers (a GPU holds a slice or not; wholly free cards): any order of summing is exact.
        gpu_fit = np.concatenate(
            (gpus.by_gpu(gpus.fits).any(axis=0), gpus.by_gpu(gpus.full).sum(axis=0) >= shapes.whole[None, slices:]),
            axis=1,
        )
        host = _host_fits(wl, cpu, mem)
        return cls(wl, shape, shapes, slices, free, cap, frac, frac.sum(axis=1), gpus, host, gpu_fit, cpu, mem)

    def fragment(
        self, *, cpu_tasks_fragment: bool = True, filled: bool = False, filled_host: bool = True
    ) -> FloatArray:
        """(C, T): ``type_fragment``."""
        wl, total, gpus = self.wl, self.total, self.gpus
        if filled:
            slots, cards_per_slot = self._slots(), self._cards_per_slot()
            frag = filled_fragment(
                slots[:, self.shape],
                cards_per_slot[:, self.shape],
                _host_slots(wl, self.cpu, self.mem),
                total,
                host_bound=filled_host,
            )
        else:
            # The same (C, G, S) arrays as the GPUs' own would be: einsum sums them as it always did.
            slice_frag = np.einsum("cg,cgs->cs", self.frac, gpus.by_state(~gpus.fits))
            whole_frag = np.einsum("cg,cgs->cs", self.frac, gpus.by_state(~gpus.full))
            frag = np.concatenate((slice_frag, whole_frag), axis=1)[:, self.shape]
        per_type = np.where(self.host & self.gpu_fit[:, self.shape], frag, total[:, None])
        if wl.is_cpu.any():  # a type that asks for no GPU: only its own columns
            cpu_types = np.flatnonzero(wl.is_cpu)
            total_there = np.broadcast_to(total[:, None], (total.size, cpu_types.size))
            per_type[:, cpu_types] = (
                total_there if cpu_tasks_fragment else np.where(self.host[:, cpu_types], 0.0, total_there)
            )
        return np.asarray(per_type)

    def places(self) -> FloatArray:
        """(C, T): ``type_capacity``."""
        gpu = self._slots()[:, self.shape]
        gpu[:, self.wl.is_cpu] = np.inf  # a type that asks for no GPU: its CPU and memory alone
        places = np.minimum(gpu, _host_slots(self.wl, self.cpu, self.mem))
        return np.asarray(np.maximum(places, 0.0) if (places < 0).any() else places)

    def _slots(self) -> FloatArray:
        """(C, S): the tasks of each GPU shape the GPUs alone could take one after another (slices
        side by side on the GPUs that hold one; free cards over the cards asked)."""
        gpus, n = self.gpus, self.slices
        # Whole numbers per GPU (``DistinctGpus.slots``): summed in any order, the same.
        slice_slots = gpus.by_gpu(gpus.slots).sum(axis=0)
        whole = np.where(self.shapes.whole[n:] > 0, self.shapes.whole[n:], 1.0)[None, :]
        whole_slots = np.floor(gpus.by_gpu(gpus.full).sum(axis=0) / whole)
        return np.concatenate((slice_slots, whole_slots), axis=1)

    def _cards_per_slot(self) -> FloatArray:
        """(C, S): the GPU each of ``_slots``'s tasks takes, in cards (``filled_fragment`` only)."""
        gpus, n = self.gpus, self.slices
        slice_slots = gpus.by_gpu(gpus.slots).sum(axis=0)
        need = self.shapes.frac[None, :n] * gpus.cap[:, None] + self.shapes.units[None, :n]  # (D, slices)
        cards = gpus.slots * need / np.where(gpus.cap > 0, gpus.cap, 1.0)[:, None]
        # Not whole numbers: summed over each state's GPUs in their order, as before.
        slice_cards = gpus.by_state(cards).sum(axis=1)
        per_slice = np.divide(slice_cards, slice_slots, out=np.zeros_like(slice_cards), where=slice_slots > 0)
        whole = np.where(self.shapes.whole[n:] > 0, self.shapes.whole[n:], 1.0)[None, :]
        cards_whole = np.broadcast_to(whole, (slice_slots.shape[0], whole.shape[1]))
        return np.concatenate((per_slice, cards_whole), axis=1)


@dataclass(frozen=True)
class DistinctGpus:
    """The GPUs of C node states (G slots each) as D distinct GPUs (free, size, model, usable), and
    per distinct GPU and GPU shape what FGD asks of it.

    Each per-GPU number is the same elementwise arithmetic on the same four values whichever GPU
    it is worked out for, so spreading a distinct GPU's numbers to its GPUs (``by_state``) gives
    the very arrays working them out per GPU gave. Doing so on (C, G, S) arrays broadcast from
    (C, G) cost about two thirds of scoring hundreds of new states (a decision's slowest part).
    """

    inverse: IntArray | None  # (C, G): each GPU's distinct GPU; None: each GPU its own, in order
    states: tuple[int, int]  # (C, G)
    free: FloatArray  # (D,)
    cap: FloatArray
    fits: BoolArray  # (D, slices): holds a slice of the shape
    full: BoolArray  # (D, S - slices): wholly free, and of a model the shape accepts
    slots: FloatArray  # (D, slices): slices of the shape it holds side by side (whole numbers)

    # Finding the distinct GPUs (a sort of all of them) pays only for many GPUs and shapes (new
    # states of every known type); for a few states, or one type's shape, each GPU on its own.
    DEDUPE_FROM = 16_384  # GPUs times shapes

    @classmethod
    def of(
        cls, shapes: WorkloadArrays, slices: int, free: FloatArray, cap: FloatArray, model: IntArray, usable: BoolArray
    ) -> DistinctGpus:
        dedupe = free.size * shapes.whole.size >= cls.DEDUPE_FROM
        inverse, first = _distinct_gpus(free, cap, model, usable) if dedupe else (None, None)
        if first is None:
            d_free, d_cap, d_model, d_usable = free.ravel(), cap.ravel(), model.ravel(), usable.ravel()
        else:
            d_free, d_cap, d_model, d_usable = (
                free.ravel()[first],
                cap.ravel()[first],
                model.ravel()[first],
                usable.ravel()[first],
            )
        allowed = shapes.model_mask[d_model] & d_usable[:, None]  # (D, S)
        need = shapes.frac[None, :slices] * d_cap[:, None] + shapes.units[None, :slices]
        fits = allowed[:, :slices] & (d_free[:, None] >= need - EPS)
        full = allowed[:, slices:] & (d_free >= d_cap - EPS)[:, None]
        slots = np.where(fits, np.floor((d_free[:, None] + EPS) / np.where(need > 0, need, 1.0)), 0.0)
        return cls(inverse, (free.shape[0], free.shape[1]), d_free, d_cap, fits, full, slots)

    def by_state(self, table: np.ndarray) -> np.ndarray:
        """(C, G, K): each GPU's row of ``table`` (D, K), a new C-ordered array."""
        if self.inverse is None:
            return table.reshape(*self.states, table.shape[1])
        return np.take(table, self.inverse, axis=0)

    def by_gpu(self, table: np.ndarray) -> np.ndarray:
        """(G, C, K): the same rows, GPU slot first (summing over the slots adds (C, K) planes)."""
        if self.inverse is None:
            return table.reshape(*self.states, table.shape[1]).transpose(1, 0, 2)
        return np.take(table, self.inverse.T, axis=0)


def _distinct_gpus(
    free: FloatArray, cap: FloatArray, model: IntArray, usable: BoolArray
) -> tuple[IntArray | None, IntArray | None]:
    """(C, G) each GPU's distinct GPU, and (D,) one GPU (flat index) of each; (None, None) if two
    distinct GPUs hashed alike (then every GPU is worked out on its own: the same numbers)."""
    weights = row_hash_weights(4)
    hashes = free * weights[0] + cap * weights[1] + model * weights[2] + usable * weights[3]
    _, inverse = np.unique(hashes.ravel(), return_inverse=True)
    inverse = inverse.reshape(-1)
    first = np.empty(int(inverse.max()) + 1, dtype=np.int64)
    first[inverse] = np.arange(inverse.size)  # any GPU of each: checked equal to all of them below
    exact = all(np.array_equal(column.ravel()[first][inverse], column.ravel()) for column in (free, cap, model, usable))
    if not exact:
        return None, None
    return inverse.reshape(free.shape), first


def gpu_shapes(wl: WorkloadArrays) -> tuple[WorkloadArrays, IntArray]:
    """The distinct GPU shapes of the types (cards, slice, allowed models), slices first, and each
    type's (worked out once per ``WorkloadArrays``: the remembered values score new states against
    the same known types at nearly every decision)."""
    if wl._shapes is None:
        wl._shapes = _gpu_shapes(wl)
    return wl._shapes


def _gpu_shapes(wl: WorkloadArrays) -> tuple[WorkloadArrays, IntArray]:
    key = np.column_stack((wl.whole, wl.frac, wl.units, wl.is_slice, wl.is_cpu, wl.model_mask.T)).astype(np.float64)
    rows = row_bytes(key)
    first: dict[bytes, int] = {}  # each shape's first type
    for i, row in enumerate(rows):
        first.setdefault(row, i)
    firsts = sorted(first.values(), key=lambda i: not wl.is_slice[i])  # slices first, stable
    number = {rows[i]: n for n, i in enumerate(firsts)}
    shape = np.array([number[row] for row in rows], dtype=np.int64)
    return wl.subset(np.array(firsts, dtype=np.int64)), shape


def filled_fragment(
    slots: FloatArray, cards_per_slot: FloatArray, host_slots: FloatArray, total: FloatArray, host_bound: bool = True
) -> FloatArray:
    """(C, T): the free GPU, in cards, left unused when each node takes as many tasks of type t
    as it can, one after another.

    FGD asks whether *one* task of t fits; a node with seven free cards fits a four-card task
    and counts no fragment for it, though the next four-card task will not find the other
    three, and a card with 0.7 free counts none for half-card slices though 0.2 of it stays
    unused. Here those remainders count, and so do GPUs a type could use but the node's CPU
    or memory cannot feed: a node with eight free cards and CPU for two half-card slices
    leaves seven cards to that type. Nothing is chosen: the count follows from the node and t.
    """
    taken = np.minimum(slots, host_slots) if host_bound else slots
    return np.asarray(np.maximum(total[:, None] - taken * cards_per_slot, 0.0))


def host_only_after(
    wl: WorkloadArrays,
    now: FloatArray,
    free: FloatArray,
    cap: FloatArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
) -> FloatArray:
    """(K, C, T): what ``FitParts`` gives (fragment, then places when K is 2) for C node states that
    differ from states whose values are ``now`` only by less CPU and memory (``cpu``, ``mem``: the
    states after placing a task that asks for no GPU), without looking at their GPUs again.

    Exactly the same numbers (``filled=False``), because the GPUs, and so every GPU term, are those
    of ``now``, and CPU and memory only shrink, so a type that fits the host after fit it before:
    - a fragment is the whole free GPU (``total``) wherever the type does not fit the host, else
      what it was (both for GPU types, whose fragment was ``total`` already where the GPU failed,
      and for types asking for no GPU, which score 0 or ``total`` as they fit or not);
    - places are the least of the GPU's and the host's (``_host_slots``), and the host's after are
      at most the host's before, so ``min(places now, host's after)`` is ``min(GPU's, host's after)``.
    Every step picks one of two stored numbers: no arithmetic that could round differently.
    """
    total = _free_share(free, cap, usable).sum(axis=1)
    fragment = np.where(_host_fits(wl, cpu, mem), now[0], total[:, None])
    if now.shape[0] == 1:
        return np.asarray(fragment[None, :, :])
    return np.stack((fragment, np.minimum(now[1], _host_slots(wl, cpu, mem))))


def _free_share(free: FloatArray, cap: FloatArray, usable: BoolArray) -> FloatArray:
    """(C, G): each usable GPU's free share of its card (0 for the others)."""
    return np.asarray(np.where(usable, free / np.where(cap > 0, cap, 1.0), 0.0))


def _host_fits(wl: WorkloadArrays, cpu: FloatArray, mem: FloatArray) -> BoolArray:
    """(C, T): whether the node's CPU and memory take one task of each type."""
    return np.asarray((cpu[:, None] >= wl.cpu[None, :]) & (mem[:, None] >= wl.mem[None, :]))


def _host_slots(wl: WorkloadArrays, cpu: FloatArray, mem: FloatArray) -> FloatArray:
    """(C, T): the tasks of each type the node's CPU and memory alone could take."""
    with np.errstate(divide="ignore", invalid="ignore"):
        by_cpu = np.floor((cpu[:, None] + EPS) / wl.cpu[None, :])
        by_mem = np.floor((mem[:, None] + EPS) / wl.mem[None, :])
    slots = np.minimum(by_cpu, by_mem)
    # A type that asks for no CPU (or memory) is not bounded by it: infinitely many.
    unbounded = (wl.cpu <= 0) | (wl.mem <= 0)
    if unbounded.any():
        slots[:, unbounded] = np.where(wl.cpu[unbounded] > 0, by_cpu[:, unbounded], np.inf)
        slots[:, unbounded] = np.minimum(
            slots[:, unbounded], np.where(wl.mem[unbounded] > 0, by_mem[:, unbounded], np.inf)
        )
    return np.asarray(slots)


def gpu_cards(wl: WorkloadArrays) -> FloatArray:
    """(T,): the GPU a task of each type takes, in cards (a slice in units counts as one card)."""
    return np.where(wl.whole > 0, wl.whole, np.where(wl.frac > 0, wl.frac, wl.is_slice.astype(np.float64)))


def expected_overflow(mean: FloatArray, places: FloatArray) -> FloatArray:
    """E[max(0, N - c)]: arrivals of a type expected to find no place, for N ~ Poisson(mean)
    arrivals and c places left. ``mean`` is (T,), ``places`` (C, T); the answer is (C, T).

    Uses E[(N - c)+] = mean P(N >= c) - c P(N >= c + 1) (as k P(N = k) = mean P(N = k - 1)),
    with the Poisson distribution summed up to the largest c.
    """
    c = np.asarray(places, dtype=np.float64)
    top = int(c.max(initial=0.0)) + 1
    k = np.arange(top + 1, dtype=np.float64)
    log_factorial = np.concatenate(([0.0], np.cumsum(np.log(k[1:]))))
    with np.errstate(divide="ignore", invalid="ignore"):  # mean 0: log 0; its pmf is set below
        log_pmf = k[:, None] * np.log(mean)[None, :] - mean[None, :] - log_factorial[:, None]
    pmf = np.where(mean[None, :] > 0, np.exp(log_pmf), (k == 0)[:, None].astype(np.float64))  # (K, T)
    below = np.concatenate((np.zeros((1, mean.size)), np.cumsum(pmf, axis=0)))  # below[j] = P(N < j)
    columns = np.arange(mean.size)[None, :]
    at_least = 1.0 - below[c.astype(np.int64), columns]
    above = 1.0 - below[c.astype(np.int64) + 1, columns]
    return np.asarray(np.maximum(mean[None, :] * at_least - c * above, 0.0))


def bound_demand_per_free_card(wl: WorkloadArrays, free_cards: FloatArray) -> FloatArray:
    """(M,): the workload's demand from model-bound types for each GPU model, per free card of it.

    A type is bound when it does not accept every model of the cluster; its demand (cards, or a
    slice's share of a card; a slice asked in units counts as the one card it touches) is split
    evenly over the models it accepts. ``free_cards`` is the free GPU of each model, in cards.
    A model with no free GPU scores 0: no candidate of it exists to weigh.
    """
    cards = gpu_cards(wl)
    bound = ~wl.model_mask.all(axis=0)
    accepted = wl.model_mask.sum(axis=0)
    split = np.where(wl.model_mask, 1.0 / np.maximum(accepted, 1), 0.0)  # (M, T)
    demand = split @ (wl.weight * cards * bound)
    return np.asarray(np.divide(demand, free_cards, out=np.zeros_like(demand), where=free_cards > 0))


def row_bytes(rows: FloatArray) -> list[bytes]:
    """Each row's exact bytes (a key that tells every distinct row apart), in one call."""
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    return list(rows.view(f"V{rows.shape[1] * 8}").ravel().tolist())


def row_hash_weights(width: int) -> FloatArray:
    """Fixed random weights: equal rows get equal hashes, distinct rows (almost surely) not."""
    if width not in _HASH_WEIGHTS:
        _HASH_WEIGHTS[width] = np.random.default_rng(width).uniform(1.0, 2.0, width)
    return _HASH_WEIGHTS[width]


_HASH_WEIGHTS: dict[int, FloatArray] = {}


def distinct_gpus(state: ClusterState, cand: BoolArray) -> BoolArray:
    """Drop candidate GPUs equal (free, size, model) to an earlier candidate on the same node."""
    rows = np.flatnonzero(cand.any(axis=1))  # only nodes with a candidate: often a few of many
    c = cand[rows]
    # Equal GPUs hash alike; distinct ones (almost surely) not.
    weights = row_hash_weights(3)
    gpu = state.free[rows] * weights[0] + state.cap[rows] * weights[1] + state.model[rows] * weights[2]
    # Each GPU against the GPUs before it only, a column at a time (a node has a few): comparing
    # every pair at once and masking the later half cost twice as much, on every slice decision.
    repeated = np.zeros(c.shape, dtype=bool)
    for g in range(1, cand.shape[1]):
        repeated[:, g] = ((gpu[:, :g] == gpu[:, g : g + 1]) & c[:, :g]).any(axis=1)
    kept = np.zeros_like(cand)
    kept[rows] = c & ~repeated
    return np.asarray(kept, dtype=bool)
