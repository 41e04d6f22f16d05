"""`gpuslice top`: what the platform holds now, in a terminal (an admin over ssh).

Pure here: the snapshot (cards and the slices on them, the line, alerts firing), its rows
sorted and filtered, and the text and JSON views. The snapshot is read from the hub's APIs
by hub/top_source.py; the interactive view (Textual) is ``TopApp``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sizes import format_bytes

SORTS = ("card", "user", "idle", "size")


@dataclass(frozen=True)
class Slice:
    user: str
    server: str
    memory_bytes: int
    idle_s: float | None  # seconds since the server's last activity (None: never active, or not known)


@dataclass(frozen=True)
class Card:
    node: str
    index: str
    model: str
    capacity_bytes: int
    simulated: bool
    slices: tuple[Slice, ...] = ()

    @property
    def held_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.slices)


@dataclass(frozen=True)
class Waiting:
    user: str
    server: str
    position: int
    ask: str  # the request in words ("4 GiB", "1 whole GPU")
    waited_s: float
    expected: str = ""  # the expected start in words, where the hub knows it


@dataclass(frozen=True)
class Firing:
    name: str
    severity: str
    where: str
    summary: str


@dataclass(frozen=True)
class Snapshot:
    cards: tuple[Card, ...] = ()
    line: tuple[Waiting, ...] = ()
    alerts: tuple[Firing, ...] = ()
    problems: tuple[str, ...] = ()  # sources that did not answer, in words
    taken_at: float = 0.0


@dataclass(frozen=True)
class Row:
    """One line of the slices table: a slice on its card, or a free card."""

    card: str
    model: str
    user: str
    server: str
    memory_bytes: int
    card_free_bytes: int
    idle_s: float | None
    order: tuple[Any, ...] = field(default=(), compare=False)


def duration(seconds: float | None) -> str:
    """'-', '45 s', '12 min', '3 h 05 min'."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def rows(snapshot: Snapshot, sort: str = "card", text: str = "") -> list[Row]:
    """The slices (and free cards) matching ``text`` (in the user, server, card or model), sorted."""
    if sort not in SORTS:
        raise ValueError(f"sort by one of {', '.join(SORTS)}, not {sort!r}")
    found = []
    for card in snapshot.cards:
        name = f"{card.node}/{card.index}"
        free = card.capacity_bytes - card.held_bytes
        for s in card.slices or (Slice("", "", 0, None),):
            row = Row(name, card.model, s.user, s.server, s.memory_bytes, free, s.idle_s)
            if text and not any(text.lower() in v.lower() for v in (row.card, row.model, row.user, row.server)):
                continue
            found.append(row)
    keys: dict[str, Callable[[Row], Any]] = {
        "card": lambda r: (r.card, r.user),
        "user": lambda r: (r.user == "", r.user, r.card),
        "idle": lambda r: (-(r.idle_s if r.idle_s is not None else -1), r.card),  # longest idle first
        "size": lambda r: (-r.memory_bytes, r.card),
    }
    return sorted(found, key=keys[sort])


def table_cells(row: Row) -> tuple[str, ...]:
    return (
        row.card,
        row.model,
        row.user or "(free)",
        row.server or "-",
        format_bytes(row.memory_bytes) if row.user else "-",
        format_bytes(row.card_free_bytes),
        duration(row.idle_s) if row.user else "-",
    )


COLUMNS = ("card", "model", "user", "server", "slice", "card free", "idle")


def summary(snapshot: Snapshot) -> str:
    capacity = sum(c.capacity_bytes for c in snapshot.cards)
    held = sum(c.held_bytes for c in snapshot.cards)
    servers = sum(len(c.slices) for c in snapshot.cards)
    simulated = " (simulated)" if any(c.simulated for c in snapshot.cards) else ""
    return (
        f"{len(snapshot.cards)} cards{simulated}, {format_bytes(held)} of {format_bytes(capacity)} held by "
        f"{servers} servers; {len(snapshot.line)} waiting; {len(snapshot.alerts)} alerts firing"
    )


def text(snapshot: Snapshot, sort: str = "card", filter_text: str = "") -> str:
    """The whole view as plain text (``--once``)."""
    table = [COLUMNS, *(table_cells(r) for r in rows(snapshot, sort, filter_text))]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    out = [summary(snapshot), ""]
    out += ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table]
    out += ["", "Waiting for a GPU:" if snapshot.line else "Nobody waits for a GPU."]
    out += [
        f"  {w.position}. {w.user} ({w.server or 'default server'}) {w.ask}, waiting {duration(w.waited_s)}"
        + (f", expected {w.expected}" if w.expected else "")
        for w in snapshot.line
    ]
    out += ["", "Alerts firing:" if snapshot.alerts else "No alert is firing."]
    out += [f"  {a.severity}: {a.name}" + (f" on {a.where}" if a.where else "") for a in snapshot.alerts]
    out += [f"(not shown: {p})" for p in snapshot.problems]
    return "\n".join(out)


def to_json(snapshot: Snapshot) -> str:
    data = asdict(snapshot)
    for card in data["cards"]:
        card["held_bytes"] = sum(s["memory_bytes"] for s in card["slices"])
    return json.dumps(data, indent=2)


def line_cells(waiting: Sequence[Waiting]) -> list[tuple[str, ...]]:
    return [(str(w.position), w.user, w.server or "-", w.ask, duration(w.waited_s), w.expected or "-") for w in waiting]
