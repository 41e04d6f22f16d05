"""What fgd and default score per node state and task type, remembered across decisions. Pure code.

A node state's fragment for one task type (and the places it has for that type) depends on
that state and that type alone: not on the other types of the target workload, nor on their
popularity. Live, the target workload changes at every arrival (its weights always, its types
now and then), so the policies remember each state's values *per type* and weigh them by the
popularity of the moment; a decision scores only the states and types it has not seen.

Types are numbered in the order they first enter a target (the *known types*); a policy weighs
all of them, those outside the target of the moment with weight 0. A state's row holds the
values of the types known when it was scored; a type new since is scored for that state when
it is next asked for. One commit changes one node, so nearly every candidate state of the next
decision (a node after placing the task) was scored at an earlier decision: a decision costs a
hash of its candidates and one look-up per distinct state.

The table holds at most ``slots`` states of at most ``max_types`` types; past the first it
starts again empty, past the second it forgets the known types too (a decision then scores
afresh).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from spawner.placement.fragmentation import Workload, WorkloadArrays, row_bytes, row_hash_weights
from spawner.placement.state import BoolArray, Demand, FloatArray, IntArray

# (types, free, cap, model, usable, cpu, mem) -> (K, C, T): K values per node state and type.
Scorer = Callable[[WorkloadArrays, FloatArray, FloatArray, IntArray, BoolArray, FloatArray, FloatArray], FloatArray]

# 16,384 states of up to 192 types and two values each: at most 48 MB, written only as used.
SLOTS = 16_384
MAX_TYPES = 192
# The rows ahead of those in use that are written before they are needed (``TypeValues._ready``),
# and how many more at most each call writes.
READY_AHEAD = 1_024
READY_STEP = 32


def zeros_in_small_pages(shape: tuple[int, ...]) -> FloatArray:
    """Zeros, in the kernel's small pages. The table is written a few rows at a time as states
    come; numpy asks for huge pages on large arrays, and a first write into one can hold a
    decision for milliseconds while the kernel assembles 2 MB (decisions of 10-12 ms that had
    nothing new to score, on the shared test machine)."""
    size = int(np.prod(shape)) * 8
    if size == 0:
        return np.zeros(shape)
    memory = mmap.mmap(-1, size)  # anonymous: zero-filled
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=np.float64).reshape(shape)


def state_hashes(
    free: FloatArray, cap: FloatArray, model: IntArray, usable: BoolArray, cpu: FloatArray, mem: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Each node state as one row of numbers (its key), and a hash of it: equal states hash
    alike; distinct ones (almost surely) not."""
    key = np.column_stack((free, cap, model, usable, cpu, mem)).astype(np.float64)
    return key, key @ row_hash_weights(key.shape[1])


@dataclass(frozen=True)
class Distinct:
    """The values of C node states, each distinct state's once (U of them)."""

    of_each: FloatArray  # (K, U, known)
    inverse: IntArray  # (C,): each state's row of ``of_each``
    # (U,): each distinct state's row of the table (``TypeValues.at_slots``); None: not remembered.
    slots: IntArray | None = None

    def plane(self, k: int) -> FloatArray:
        """(C, known): every state's ``k``-th value per type."""
        return np.asarray(self.of_each[k][self.inverse])

    def every(self, since: int = 0) -> FloatArray:
        """(K, C, known - since): every state's values, of the known types from ``since`` on."""
        return np.asarray(self.of_each[:, :, since:][:, self.inverse])


class TypeValues:
    """Per node state and known type, ``width`` values of ``score``, remembered (``remember=False``:
    every state scored afresh at every call, the baseline ``bench.latency`` compares with)."""

    def __init__(
        self,
        score: Scorer,
        width: int,
        model_names: Sequence[str],
        *,
        remember: bool = True,
        slots: int = SLOTS,
        max_types: int = MAX_TYPES,
    ) -> None:
        self.score = score
        self.width = width
        self.model_names = list(model_names)
        self.remember = remember
        self.max_types = max_types
        self.generation = 0  # bumped whenever the known types are numbered anew
        self.epoch = 0  # bumped whenever the table's rows are handed out anew (a state's row no longer holds)
        self._column: dict[Demand, int] = {}
        self.types = WorkloadArrays.build(Workload((), ()), self.model_names)  # the known types
        self._since: dict[int, WorkloadArrays] = {}  # the known types from the n-th on
        self._slot: dict[bytes, int] = {}
        self._table = zeros_in_small_pages((width, slots if remember else 0, max_types))
        self._known = np.zeros(slots if remember else 0, dtype=np.int64)  # types scored, per slot
        self._ready = 0  # the table's rows below this are in memory (written once)

    @property
    def known(self) -> int:
        """How many types are known: the columns of every row ``values`` answers."""
        return len(self._column)

    def columns(self, demands: Sequence[Demand]) -> IntArray:
        """The column of each type, numbering the new ones (and starting again when full)."""
        new = [d for d in dict.fromkeys(demands) if d not in self._column]
        if len(self._column) + len(new) > self.max_types:
            asked = len(set(demands))
            if asked > self.max_types:  # a target wider than the table: widen it
                self.max_types = asked
                self._table = zeros_in_small_pages((self.width, self._known.size, asked))
                self._ready = 0
            self._column.clear()
            self._slot.clear()
            self.generation += 1
            self.epoch += 1
            new = list(dict.fromkeys(demands))
        if new:
            for demand in new:
                self._column[demand] = len(self._column)
            known = tuple(self._column)
            self.types = WorkloadArrays.build(Workload(known, (0.0,) * len(known)), self.model_names)
            self._since = {}
        return np.array([self._column[d] for d in demands], dtype=np.int64)

    def values(
        self,
        free: FloatArray,
        cap: FloatArray,
        model: IntArray,
        usable: BoolArray,
        cpu: FloatArray,
        mem: FloatArray,
    ) -> FloatArray:
        """(K, C, known): the values of each of C node states for every known type."""
        return self.distinct(free, cap, model, usable, cpu, mem).every()

    def distinct(
        self,
        free: FloatArray,
        cap: FloatArray,
        model: IntArray,
        usable: BoolArray,
        cpu: FloatArray,
        mem: FloatArray,
    ) -> Distinct:
        """``values``, each distinct state's once: a decision's candidates are often hundreds of
        nodes in some tens of distinct states."""
        # Nodes in the same state score the same (common: a cluster has few node shapes and
        # many empty nodes), so each distinct state is looked at once.
        key, hashes = state_hashes(free, cap, model, usable, cpu, mem)
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        inverse, at = inverse.reshape(-1), first
        if not self.remember:
            return Distinct(self.score(self.types, free[at], cap[at], model[at], usable[at], cpu[at], mem[at]), inverse)
        slots = self._slots(row_bytes(key[first]))
        return Distinct(
            self.at_slots(slots, free[at], cap[at], model[at], usable[at], cpu[at], mem[at]), inverse, slots
        )

    def at_slots(
        self,
        slots: IntArray,
        free: FloatArray,
        cap: FloatArray,
        model: IntArray,
        usable: BoolArray,
        cpu: FloatArray,
        mem: FloatArray,
    ) -> FloatArray:
        """(K, U, known): the values of the states at these distinct rows of the table (the states
        given, row by row, are those the rows hold), scoring the types each lacks. A caller that
        kept a state's row (``Distinct.slots``, while ``epoch`` stays) need not hash it again."""
        known = self.known
        scored_types = self._known[slots]
        # States new to the table (no type scored), then states that lack the types known since.
        for behind in (np.flatnonzero(scored_types == 0), np.flatnonzero((scored_types > 0) & (scored_types < known))):
            if behind.size == 0:
                continue
            since = int(scored_types[behind].min())
            at, columns = behind, np.arange(since, known)
            if since not in self._since:
                self._since[since] = self.types.subset(columns)
            scored = self.score(self._since[since], free[at], cap[at], model[at], usable[at], cpu[at], mem[at])
            self._table[:, slots[behind, None], columns[None, :]] = scored
            self._known[slots[behind]] = known
        return np.asarray(self._table[:, slots, :known])

    def _slots(self, keys: list[bytes]) -> IntArray:
        """The table row of each state; states not seen get a row that knows no type."""
        if len(keys) > self._known.size:  # more distinct states at once than rows: more rows
            self._table = zeros_in_small_pages((self.width, len(keys), self.max_types))
            self._known = np.zeros(len(keys), dtype=np.int64)
            self._slot.clear()
            self._ready = 0
            self.epoch += 1
        slots = list(map(self._slot.get, keys))
        new = [i for i, s in enumerate(slots) if s is None]
        if new and len(self._slot) + len(new) > self._known.size:
            self._slot.clear()
            self.epoch += 1
            slots = [None] * len(keys)
            new = list(range(len(keys)))
        start = len(self._slot)
        for offset, i in enumerate(new):
            self._slot[keys[i]] = slots[i] = start + offset
        self._known[start : start + len(new)] = 0
        self._get_ready(start + len(new))
        return np.array(slots, dtype=np.int64)

    def _get_ready(self, used: int) -> None:
        """Write (zeros) a few of the rows ahead of the ``used`` ones, so that they are in memory
        when new states take them. The table's pages come from the kernel at their first write
        (a fault each, 4 KiB: under three rows); most decisions take a few new rows, a few take
        hundreds (a type's first arrivals: every candidate's state after is new), and those
        then faulted some 300-1,000 times. Written ahead, a few rows at every call, the faults fall
        on the decisions that take few."""
        ready = max(self._ready, used)
        upto = min(used + READY_AHEAD, ready + READY_STEP, self._known.size)
        if upto > ready:
            self._table[:, ready:upto, :] = 0.0  # rows no state holds yet: zeros already
            ready = upto
        self._ready = ready
