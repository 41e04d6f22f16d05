"""Nodes -> GPUs -> allocations: the one model placement, explanations, metrics and the portal read.

Pure code. Built here from this machine's GPUs and the ledger's allocations
(``build_local``); on Kubernetes each sharing backend reads it from the cluster's objects
(spawner/sharing/, ``build_kube``). Also the quantities and pod states every reader shares.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spawner.shares import ShareError, parse_quantity

USERNAME = "hub.jupyter.org/username"
SERVERNAME = "hub.jupyter.org/servername"
GROUP_ANNOTATION = "gpuslice.io/group"  # the group a notebook pod's slice is charged to (spawner.kube writes it)

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Allocation:
    """What one server holds on one GPU."""

    user: str
    server: str
    memory_bytes: int
    owner: str = ""  # pod name or ledger key
    whole: bool = False


@dataclass
class Gpu:
    node: str
    index: int
    model: str
    memory_bytes: int
    uuid: str = ""
    healthy: bool = True
    simulated: bool = False
    mig_profile: str | None = None
    allocations: list[Allocation] = field(default_factory=list)

    @property
    def allocated_bytes(self) -> int:
        if any(a.whole for a in self.allocations):
            return self.memory_bytes
        return min(self.memory_bytes, sum(a.memory_bytes for a in self.allocations))

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.allocated_bytes

    @property
    def is_free(self) -> bool:
        return self.healthy and not self.allocations


@dataclass
class Node:
    name: str
    cpu_milli: int
    memory_bytes: int
    gpus: list[Gpu] = field(default_factory=list)
    cpu_used_milli: int = 0
    memory_used_bytes: int = 0
    healthy: bool = True
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cpu_free_milli(self) -> int:
        return self.cpu_milli - self.cpu_used_milli

    @property
    def memory_free_bytes(self) -> int:
        return self.memory_bytes - self.memory_used_bytes


@dataclass
class Inventory:
    nodes: list[Node]
    backend: str = "local"  # the sharing backend's name (spawner/sharing/)
    slice_note: str | None = None  # what the form says of slices, where the backend's settings change it
    # What could not be read (a malformed annotation, a pod on a node that is gone):
    # the rest of the inventory is still built; callers log these.
    warnings: list[str] = field(default_factory=list)

    def gpus(self) -> Iterable[Gpu]:
        for node in self.nodes:
            yield from node.gpus

    def allocations(self) -> Iterable[tuple[Gpu, Allocation]]:
        for gpu in self.gpus():
            for allocation in gpu.allocations:
                yield gpu, allocation

    @property
    def capacity_bytes(self) -> int:
        return sum(g.memory_bytes for g in self.gpus())

    @property
    def allocated_bytes(self) -> int:
        return sum(g.allocated_bytes for g in self.gpus())


# ---------------------------------------------------------------- local


def build_local(
    gpus: Iterable[Gpu],
    allocations: Iterable[tuple[int, Allocation]] = (),
    *,
    node_name: str = "localhost",
    cpu_milli: int = 0,
    memory_bytes: int = 0,
) -> Inventory:
    """One node holding copies of ``gpus``; ``allocations`` are (GPU index, allocation) pairs.

    ``cpu_milli``/``memory_bytes`` of 0 mean "not limited" (a personal machine). The
    GPUs passed in are not changed, so callers may keep one list for the machine.
    """
    by_index = {gpu.index: replace(gpu, allocations=list(gpu.allocations)) for gpu in gpus}
    for index, allocation in allocations:
        if index not in by_index:
            raise ValueError(
                f"allocation {allocation.owner or allocation.user!r} is on GPU {index}, which does not exist"
            )
        by_index[index].allocations.append(allocation)
    node = Node(
        node_name, cpu_milli or 1 << 40, memory_bytes or 1 << 60, sorted(by_index.values(), key=lambda g: g.index)
    )
    return Inventory([node], "local")


# ---------------------------------------------------------------- kubernetes


def cpu_milli(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity in millicores: "2" -> 2000, "250m" -> 250."""
    text = str(quantity).strip()
    if text.endswith("m"):
        return int(float(text[:-1]))
    return round(float(text) * 1000)


def memory_bytes(quantity: str | int | float) -> int:
    try:
        return parse_quantity(str(quantity))
    except ShareError as exc:
        raise ValueError(f"bad memory quantity {quantity!r}") from exc


# A placement with no pod of its own listed this long after it was made was never made (its hub was killed
# between the two): its room is free again. Far above the moment a pod takes to be created and listed.
ORPHAN_AFTER_S = 120.0


@dataclass(frozen=True)
class Pending:
    """A placement decided on a cluster whose pod the cluster's listing does not count yet.

    A pod is listed only after it is created, and a gpushare, MIG or whole-card pod holds
    its cards only once bound to a node: until then the listing shows its room as free.
    The hub's spawns and the job dispatcher are two processes: each writes its placements
    to the ledger (``placing``) in the transaction that decides them, and each counts the
    other's. ``gpus`` index ``node``'s cards as in ``Inventory`` (a placement's ``Choice``);
    ``allocation`` is what each of them holds; ``asked_bytes`` is charged to ``group``.
    ``pod``: the notebook's pod, or a batch job's Job (its pod gets a name of the Job
    controller's); ``placed_at``: when it was decided (wall clock).
    """

    pod: str
    node: str
    gpus: tuple[int, ...]
    allocation: Allocation
    group: str | None = None
    asked_bytes: int = 0
    placed_at: float = 0.0

    @property
    def key(self) -> str:
        """The ledger's "user/server" of what was placed ("user/job:N" for a batch job)."""
        return f"{self.allocation.user}/{self.allocation.server}"


def pod_key(pod: Obj) -> str:
    """A notebook or job pod's "user/server", from the annotations the spawner and dispatcher write."""
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    user = annotations.get(USERNAME) or (meta.get("labels") or {}).get(USERNAME) or ""
    return f"{user}/{annotations.get(SERVERNAME, '')}"


def live_pending(pending: Iterable[Pending], pods: Iterable[Obj], now: float) -> list[Pending]:
    """The placements still to count: made less than ``ORPHAN_AFTER_S`` ago, or with a pod of theirs listed (one
    unbound holds no card in the listing yet, for as long as it waits)."""
    listed = {pod.get("metadata", {}).get("name") for pod in pods} | {pod_key(pod) for pod in pods}
    return [p for p in pending if now - p.placed_at < ORPHAN_AFTER_S or p.pod in listed or p.key in listed]


def with_pending(
    listed: Inventory, pods: Iterable[Obj], pending: Iterable[Pending], now: float, but: str = ""
) -> tuple[Inventory, list[Pending]]:
    """A copy of the ``listed`` cluster charged with the ``pending`` placements still to count (``live_pending``),
    but the one of key ``but`` (a spawn's own); and those placements."""
    pods = list(pods)
    live = [p for p in live_pending(pending, pods, now) if p.key != but]
    inventory = copy.deepcopy(listed)
    add_pending(inventory, live)
    return inventory, live


def add_pending(inventory: Inventory, pending: Iterable[Pending]) -> list[str]:
    """Charge ``inventory`` with the placements it does not count yet; return the pods it counts now.

    A placement the inventory already holds GPUs for (by pod name, or by user and server: a
    job's pod is named by the Job controller) is counted once, as the cluster has it: its pod
    is returned.
    """
    counted = {allocation.owner for _, allocation in inventory.allocations()}
    counted |= {f"{a.user}/{a.server}" for _, a in inventory.allocations()}
    by_name = {node.name: node for node in inventory.nodes}
    landed = []
    for placed in pending:
        if placed.pod in counted or placed.key in counted:
            landed.append(placed.pod)
            continue
        node = by_name.get(placed.node)
        if node is None:
            continue  # the node is gone: so is the room the placement took
        for index in placed.gpus:
            if 0 <= index < len(node.gpus):
                node.gpus[index].allocations.append(placed.allocation)
    return landed


def holds_resources(pod: Obj) -> bool:
    """Finished pods and pods being deleted hold nothing."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return str(pod.get("status", {}).get("phase") or "") not in {"Succeeded", "Failed"}
