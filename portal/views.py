"""Pure view models: join the inventory, Prometheus readings and hub data into rows."""

from __future__ import annotations

from dataclasses import dataclass

from portal.data.hub import ServerRow
from portal.data.prometheus import GpuReading
from spawner.inventory import Inventory
from spawner.ledger import Held
from spawner.quotas import GroupQuota
from spawner.shares import format_bytes


@dataclass(frozen=True)
class GpuRow:
    node: str
    gpu: int
    model: str
    simulated: bool
    capacity_bytes: int
    allocated_bytes: int
    used_bytes: float | None
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    last_xid: int | None
    holders: str  # "alice 4 GiB, bob 2 GiB"


def gpu_rows(inventory: Inventory, readings: dict[tuple[str, str], GpuReading] | None) -> list[GpuRow]:
    rows = []
    for node in inventory.nodes:
        for gpu in node.gpus:
            reading = None if readings is None else readings.get((node.name, str(gpu.index)))
            holders = ", ".join(
                f"{a.user}{'/' + a.server if a.server else ''} "
                + ("whole card" if a.whole else format_bytes(a.memory_bytes))
                for a in gpu.allocations
            )
            rows.append(
                GpuRow(
                    node=node.name,
                    gpu=gpu.index,
                    model=gpu.model,
                    simulated=gpu.simulated,
                    capacity_bytes=gpu.memory_bytes,
                    allocated_bytes=gpu.allocated_bytes,
                    used_bytes=reading.used_bytes if reading else None,
                    utilization_pct=reading.utilization_pct if reading else None,
                    temperature_c=reading.temperature_c if reading else None,
                    power_w=reading.power_w if reading else None,
                    last_xid=reading.last_xid if reading else None,
                    holders=holders,
                )
            )
    return rows


@dataclass(frozen=True)
class ClassRow:
    name: str
    members: int
    running: int
    allocated_bytes: int
    budget_bytes: int | None
    idle_servers: int  # running, no activity for the idle threshold


def class_rows(
    groups: dict[str, list[str]],
    rules: dict[str, GroupQuota],
    holds: list[Held],
    servers: list[ServerRow],
    idle_after_s: float,
    now_ts: float,
) -> list[ClassRow]:
    rows = []
    for name, members in sorted(groups.items()):
        people = set(members)
        mine = [s for s in servers if s.user in people and s.state == "running"]
        idle = [s for s in mine if s.last_activity and now_ts - s.last_activity.timestamp() > idle_after_s]
        rule = rules.get(name)
        rows.append(
            ClassRow(
                name=name,
                members=len(members),
                running=len(mine),
                allocated_bytes=sum(h.memory_bytes for h in holds if h.group == name),
                budget_bytes=rule.budget_bytes if rule else None,
                idle_servers=len(idle),
            )
        )
    return rows


def server_matches(row: ServerRow, states: set[str], search: str) -> bool:
    text = search.strip().lower()
    return (not states or row.state in states) and (not text or text in row.user.lower() or text in row.image.lower())


def slice_text(row: ServerRow, hold: Held | None) -> str:
    """What the server holds: from the ledger while it runs, else what it asked for."""
    if hold is not None:
        return "whole card" if hold.whole else format_bytes(hold.memory_bytes)
    if row.state == "stopped":
        return ""
    if row.gpus:
        return f"{row.gpus} whole GPU(s)"
    return "CPU only" if row.gpu_memory in ("0", "") else row.gpu_memory
