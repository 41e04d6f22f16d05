"""The ledger's rows of a placement and totals over rows: pure, shared by the spawner, the GPU
line and the job dispatcher (which would otherwise import the spawner for them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spawner.ledger import Held
from spawner.shares import GpuRequest, RequestKind

if TYPE_CHECKING:
    from spawner.inventory import Inventory
    from spawner.placement import Choice


def placement_rows(
    key: str, server: str, request: GpuRequest, inventory: Inventory, group: str | None, choice: Choice | None
) -> list[Held]:
    """The ledger rows of a local placement, one per card (none for CPU only): a server's or a job's."""
    if choice is None:
        return []
    node = inventory.nodes[choice.node]
    whole = request.kind is RequestKind.WHOLE
    user = key.partition("/")[0]
    return [
        Held(
            key,
            node.gpus[i].index,
            user,
            server,
            node.gpus[i].memory_bytes if whole else request.bytes_on(node.gpus[i].memory_bytes),
            whole,
            group,
        )
        for i in choice.gpus
    ]


def group_bytes_of(holds: list[Held]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for h in holds:
        if h.group:
            totals[h.group] = totals.get(h.group, 0) + h.memory_bytes
    return totals


def servers_by_user(holds: list[Held]) -> dict[str, int]:
    """How many servers with a GPU each user runs (the line's fair share counts them)."""
    servers: dict[str, set[str]] = {}
    for h in holds:
        servers.setdefault(h.user, set()).add(h.key)
    return {user: len(keys) for user, keys in servers.items()}
