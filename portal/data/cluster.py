"""The local cluster: this machine's GPUs and the slices in the ledger."""

from __future__ import annotations

from pathlib import Path

from spawner.inventory import Inventory, build_local
from spawner.ledger import Held, Ledger
from spawner.mixin import machine


def local_inventory(ledger_path: Path, simulate: str) -> tuple[Inventory, list[Held]]:
    holds = Ledger(ledger_path).holdings() if ledger_path.exists() else []
    return build_local(machine(simulate).gpus, [(h.gpu_index, h.allocation()) for h in holds]), holds
