"""The local cluster: this machine's GPUs and the slices in the ledger."""

from __future__ import annotations

from pathlib import Path

from spawner.inventory import Gpu, Inventory, build_local
from spawner.ledger import Held, Ledger
from spawner.mixin import machine


def local_inventory(ledger_path: Path, simulate: str) -> tuple[Inventory, list[Held]]:
    holds = Ledger(ledger_path).holdings() if ledger_path.exists() else []
    gpus = [
        Gpu(g.node, g.index, g.model, g.memory_bytes, g.uuid, g.healthy, g.simulated) for g in machine(simulate).gpus
    ]
    return build_local(gpus, [(h.gpu_index, h.allocation()) for h in holds]), holds
