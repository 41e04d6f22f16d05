"""The local cluster: this machine's GPUs, the slices in the ledger and each server's events."""

from __future__ import annotations

from pathlib import Path

from portal.identity import Identity
from spawner.inventory import Inventory, build_local
from spawner.ledger import Held, Ledger, ServerEvent, server_key
from spawner.mixin import machine


def local_inventory(ledger_path: Path, simulate: str) -> tuple[Inventory, list[Held]]:
    holds = Ledger(ledger_path).holdings() if ledger_path.exists() else []
    return build_local(machine(simulate).gpus, [(h.gpu_index, h.allocation()) for h in holds]), holds


def latest_events(ledger_path: Path, identity: Identity) -> dict[str, ServerEvent]:
    """Each server's latest event: every server's for admins, only their own for others."""
    if not ledger_path.exists():
        return {}
    events = Ledger(ledger_path).latest_events()
    if identity.admin:
        return events
    return {key: e for key, e in events.items() if key.split("/", 1)[0] == identity.name}


def server_history(ledger_path: Path, identity: Identity, user: str, server: str) -> list[ServerEvent]:
    """One server's events, oldest first; PermissionError for someone else's unless admin."""
    if not identity.admin and identity.name != user:
        raise PermissionError(f"{identity.name} may not read {user}'s server history: only admins can")
    return Ledger(ledger_path).history(server_key(user, server)) if ledger_path.exists() else []
