"""Which backfill jobs yield their slices, and to whom. Pure code.

Backfill jobs run only on slices nobody waits for (spawner/waitline.py ``admit`` places them
last, and only when every other request present was placed). When someone then joins the line
and cannot be placed, the backfill jobs whose slices would let them start are stopped: SIGTERM,
a grace period to checkpoint, SIGKILL, and back in line (docs/jobs.md). ``preemptions`` chooses
them: for the first request that waits, in the line's own order, the fewest running backfill
jobs whose room (and, for a class held back by its budget, whose share of the budget) lets the
line's own ``admit`` place it, the most recently started first (the least work lost); then the
same for the next request that waits, with those jobs' room counted as free. Jobs already
stopping count as gone: nobody is stopped twice, or for room already on its way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from spawner.inventory import Inventory
from spawner.waitline import Entry, Reservation, admit, fair_order, waits_for_room


@dataclass(frozen=True)
class Running:
    """A backfill job holding a slice: its line key, owner, class charged and bytes held, its start."""

    key: str
    user: str
    group: str | None
    held_bytes: int
    started: float


@dataclass(frozen=True)
class Preemption:
    """Stop ``key`` so that ``for_entry`` (the request that waits) can be placed."""

    key: str
    for_entry: Entry


def without(inventory: Inventory, keys: set[str]) -> Inventory:
    """A copy of ``inventory`` in which the allocations of ``keys`` are free: ledger keys (``user/server``, a job's
    ``user/job:N``, as spawner/ledger.py server_key makes them), which on Kubernetes name an allocation by its
    pod's user and server, its owner being the pod."""
    nodes = []
    for node in inventory.nodes:
        gpus = [
            replace(g, allocations=[a for a in g.allocations if not {a.owner, f"{a.user}/{a.server}"} & keys])
            for g in node.gpus
        ]
        nodes.append(replace(node, gpus=gpus))
    return replace(inventory, nodes=nodes)


@dataclass(frozen=True)
class _Line:
    """What every trial placement below sees: the people waiting and the cluster as it is."""

    people: Sequence[Entry]
    inventory: Inventory
    running: Sequence[Running]
    budgets: Mapping[str, int | None]
    group_bytes: Mapping[str, int]
    held_by_user: Mapping[str, int]
    now: float
    policy: str
    reservations: Sequence[Reservation]

    def placed(self, gone: set[str]) -> set[str]:
        """The keys the line would place if the backfill jobs in ``gone`` held nothing (their class's share too)."""
        freed: dict[str, int] = {}
        for r in self.running:
            if r.key in gone and r.group is not None:
                freed[r.group] = freed.get(r.group, 0) + r.held_bytes
        used = {g: max(0, b - freed.get(g, 0)) for g, b in self.group_bytes.items()}
        admitted = admit(
            self.people,
            without(self.inventory, gone),
            budgets=self.budgets,
            group_bytes=used,
            held_by_user=self.held_by_user,
            policy=self.policy,
            now=self.now,
            reservations=self.reservations,
        )
        return {a.entry.key for a in admitted}

    def fewest_freeing(self, waiter: Entry, candidates: Sequence[Running], gone: set[str]) -> set[str]:
        """The fewest of ``candidates`` (tried in their order) whose stop places ``waiter``; empty when none do."""
        taken: list[Running] = []
        for candidate in candidates:
            taken.append(candidate)
            if waiter.key in self.placed(gone | {r.key for r in taken}):
                break
        else:
            return set()
        # Put back whichever turned out not to be needed (the oldest first: they have done the most work).
        needed = {r.key for r in taken}
        for candidate in sorted(taken, key=lambda r: r.started):
            if waiter.key in self.placed(gone | (needed - {candidate.key})):
                needed.discard(candidate.key)
        return needed


def preemptions(
    line: Sequence[Entry],
    inventory: Inventory,
    running: Sequence[Running],
    *,
    stopping: set[str],
    budgets: Mapping[str, int | None],
    group_bytes: Mapping[str, int],
    held_by_user: Mapping[str, int],
    now: float,
    policy: str = "default",
    reservations: Sequence[Reservation] = (),
) -> list[Preemption]:
    """The running backfill jobs to stop now, each with the request it yields to (see the module's docstring)."""
    people = [e for e in line if waits_for_room(e, now)]
    if not people or not running:
        return []
    trial = _Line(people, inventory, running, budgets, group_bytes, held_by_user, now, policy, reservations)
    gone = set(stopping)
    chosen: list[Preemption] = []
    candidates = sorted((r for r in running if r.key not in gone), key=lambda r: (-r.started, r.key))
    while candidates:
        placed = trial.placed(gone)
        # The first who waits and whom stopping backfill jobs would place (one held back by servers
        # or normal jobs alone waits for those, and stops no backfill job).
        for waiter in (e for e in fair_order(people, held_by_user) if e.key not in placed):
            freed = trial.fewest_freeing(waiter, candidates, gone)
            if freed:
                break
        else:
            break
        gone |= freed
        candidates = [r for r in candidates if r.key not in freed]
        chosen += [Preemption(r.key, waiter) for r in running if r.key in freed]
    return chosen
