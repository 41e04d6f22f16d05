"""Patrols: a short health check of each free card, and cards taken out of placement until an admin clears them.
Pure code.

`gpuslice patrol` (hub/patrol.py) checks each card nobody holds, holding it meanwhile so that nobody is
placed there mid-check: on a real GPU a memory and compute test (``REAL_CHECK``, run in the card's own
process); on simulated GPUs a simulated one, which fails where the exporter's faults file injects a
fault for the card (``{"gpu": 1, "patrol": "fail"}``, or a hardware Xid). A card that fails is marked
unhealthy in the ledger: the line and every placement pass it by (``with_health``) until an admin clears
it (`gpuslice patrol clear GPU`); the metrics say so (``gpuslice_patrol_healthy``) and the alert
``GpuPatrolFailed`` points to docs/runbook.md#gpupatrolfailed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from spawner.inventory import Gpu

# Hardware Xids (docs/runbook.md#gpuxiderror): a simulated card reporting one fails its patrol.
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})
PATROL_KEY = "patrol/"  # the ledger key prefix of a card held for its check: "patrol/gpu-1"
DEFAULT_INTERVAL_S = 6 * 3600
# A card that was due but held by a user is tried again this often (it is checked once it is free).
RETRY_HELD_S = 600


@dataclass(frozen=True)
class Check:
    """One card's check: whether it passed, what was found, when (seconds since the epoch)."""

    gpu: int
    healthy: bool
    message: str
    checked: float


@dataclass(frozen=True)
class CardHealth:
    """What the ledger keeps of a card's patrols: its last check, and whether it is out of placement."""

    gpu: int
    healthy: bool  # False: out of placement until an admin clears it
    message: str
    checked: float
    cleared_by: str = ""


def patrol_key(gpu: int) -> str:
    return f"{PATROL_KEY}gpu-{gpu}"


def free_cards(gpus: Iterable[Gpu], held: Iterable[int]) -> list[int]:
    """The cards nobody holds (a patrol checks those only: it never takes a card from anyone)."""
    busy = set(held)
    return [g.index for g in gpus if g.index not in busy]


def _due_at(gpus: Iterable[int], health: Iterable[CardHealth], now: float, interval_s: float) -> dict[int, float]:
    """When each card falls due: ``interval_s`` after its last check; a card never checked is due ``now``."""
    last = {h.gpu: h.checked for h in health}
    return {g: last[g] + interval_s if g in last else now for g in gpus}


def due_cards(
    gpus: Iterable[Gpu], held: Iterable[int], health: Iterable[CardHealth], now: float, interval_s: float
) -> list[int]:
    """The free cards never checked, or last checked ``interval_s`` ago or more.

    The schedule is each card's own, kept in the ledger: a hub that restarts does not hold every free
    card for a check again (a real card's test takes seconds to minutes, and whoever pressed Start
    meanwhile would wait in line for it).
    """
    due_at = _due_at(free_cards(gpus, held), health, now, interval_s)
    return [g for g, at in due_at.items() if at <= now]


def next_patrol_in(gpus: Iterable[Gpu], health: Iterable[CardHealth], now: float, interval_s: float) -> float:
    """Seconds until the next card falls due; at least ``RETRY_HELD_S`` (a due card someone holds
    is tried again then), at most ``interval_s``."""
    due_at = _due_at((g.index for g in gpus), health, now, interval_s)
    soonest = min(due_at.values(), default=now + interval_s) - now
    return max(min(RETRY_HELD_S, interval_s), min(soonest, interval_s))


def simulated_check(gpu: Gpu, faults: Sequence[Mapping[str, object]], now: float) -> Check:
    """A simulated card passes unless a fault is injected for it: a patrol fault, or a hardware Xid."""
    for fault in faults:
        if fault.get("gpu") != gpu.index:
            continue
        if fault.get("patrol") == "fail":
            return Check(gpu.index, False, "the memory test found errors (a simulated fault)", now)
        xid = fault.get("xid")
        if isinstance(xid, int) and xid in HARDWARE_XIDS:
            return Check(gpu.index, False, f"the card reports Xid {xid} (a simulated fault)", now)
    return Check(gpu.index, True, f"memory and compute test passed ({gpu.model}, simulated)", now)


def with_health(gpus: Iterable[Gpu], unhealthy: Iterable[int]) -> list[Gpu]:
    """The cards with those a patrol failed marked unhealthy: placement never puts a slice there."""
    out = set(unhealthy)
    return [replace(g, healthy=False) if g.index in out else g for g in gpus]


def unhealthy(health: Iterable[CardHealth]) -> set[int]:
    return {h.gpu for h in health if not h.healthy}


# What runs on a real card, in a process of its own with CUDA_VISIBLE_DEVICES set to it: a fill of most
# of its free memory with a pattern read back, and a matrix product checked against the CPU's. PyTorch,
# else CuPy, whichever the platform's environment has; exit 0 passed, 1 failed (the error printed),
# 2 neither framework is there (the patrol then reports the card's NVML state only).
REAL_CHECK = r"""
import sys
try:
    import torch
    dev = torch.device("cuda:0")
    free, _ = torch.cuda.mem_get_info(dev)
    n = int(free * 0.8) // 4
    block = torch.arange(n, device=dev, dtype=torch.int32)
    if int((block - torch.arange(n, device=dev, dtype=torch.int32)).abs().sum()) != 0:
        print("memory test: the pattern read back differs"); sys.exit(1)
    del block
    a = torch.rand(2048, 2048, device=dev)
    b = torch.rand(2048, 2048, device=dev)
    if not torch.allclose((a @ b).cpu(), a.cpu() @ b.cpu(), rtol=1e-3, atol=1e-2):
        print("compute test: the product differs from the CPU's"); sys.exit(1)
    print("memory and compute test passed (PyTorch)"); sys.exit(0)
except ImportError:
    pass
try:
    import cupy
    free, _ = cupy.cuda.runtime.memGetInfo()
    n = int(free * 0.8) // 4
    block = cupy.arange(n, dtype=cupy.int32)
    if int(cupy.abs(block - cupy.arange(n, dtype=cupy.int32)).sum()) != 0:
        print("memory test: the pattern read back differs"); sys.exit(1)
    del block
    a = cupy.random.rand(2048, 2048, dtype=cupy.float32)
    b = cupy.random.rand(2048, 2048, dtype=cupy.float32)
    if not cupy.allclose(a @ b, cupy.asarray(cupy.asnumpy(a) @ cupy.asnumpy(b)), rtol=1e-3, atol=1e-2):
        print("compute test: the product differs from the CPU's"); sys.exit(1)
    print("memory and compute test passed (CuPy)"); sys.exit(0)
except ImportError:
    print("neither PyTorch nor CuPy here: no memory and compute test"); sys.exit(2)
"""
