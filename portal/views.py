"""Pure view models: join the inventory, Prometheus readings and hub data into rows."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ValidationError

from market.store import Image, Model
from portal.data.hub import ServerRow
from portal.data.prometheus import GpuReading
from spawner import environ
from spawner.inventory import Allocation, Inventory
from spawner.ledger import Held, ServerEvent, server_key
from spawner.quotas import GroupQuota
from spawner.shares import ShareError, format_bytes, parse_quantity
from spawner.sharing.kai import ClassQueue, QueuedPod
from spawner.waitline import Manager, Reservation, WaitStats
from spawner.words import INSTANT, parse_instant


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
            holders = holders_text(gpu.allocations)
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


def holders_text(allocations: list[Allocation]) -> str:
    """'alice 4 GiB, 2 others 6 GiB': names only of the allocations the data layer left named."""
    named = [
        f"{a.user}{'/' + a.server if a.server else ''} " + ("whole card" if a.whole else format_bytes(a.memory_bytes))
        for a in allocations
        if a.user
    ]
    others = [a for a in allocations if not a.user]
    if others:
        size = "whole card" if any(a.whole for a in others) else format_bytes(sum(a.memory_bytes for a in others))
        named.append(f"{len(others)} other{'s' if len(others) > 1 else ''} {size}")
    return ", ".join(named)


def memory_in_use(readings: dict[tuple[str, str], GpuReading] | None) -> float | None:
    """GPU memory in use over every card, from the same readings as the GPUs page (None: no readings)."""
    used = [r.used_bytes for r in (readings or {}).values() if r.used_bytes is not None]
    return sum(used) if used else None


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


SERVER_STATES = ("pending", "running", "stopping", "stopped", "refused", "failed")


@dataclass(frozen=True)
class ServerView:
    user: str
    server: str
    state: str  # one of SERVER_STATES
    detail: str  # why it waits, was refused, failed or stopped (and who stopped it); empty when unknown
    progress: int | None  # 0-100 while pending
    slice: str
    image: str
    age_s: float | None
    idle_s: float | None
    started: datetime | None
    last_activity: datetime | None


def server_rows(
    servers: list[ServerRow], holds: list[Held], events: dict[str, ServerEvent], now_ts: float
) -> list[ServerView]:
    """Hub state joined with the ledger: a stopped server whose last event is a failure failed."""
    held = {h.key: h for h in holds}
    rows = []
    for s in servers:
        key = server_key(s.user, s.name)
        event = events.get(key)
        state, detail, progress = _job_state(s, event)
        rows.append(
            ServerView(
                user=s.user,
                server=s.name,
                state=state,
                detail=detail,
                progress=progress,
                slice=slice_text(s, held.get(key), failed=state in ("failed", "refused")),
                image=s.image,
                age_s=now_ts - s.started.timestamp() if s.started and state != "stopped" else None,
                idle_s=now_ts - s.last_activity.timestamp() if s.last_activity and state == "running" else None,
                started=s.started,
                last_activity=s.last_activity,
            )
        )
    return rows


def _job_state(server: ServerRow, event: ServerEvent | None) -> tuple[str, str, int | None]:
    if server.state == "starting":
        if event is None or event.failure or event.kind == "stopped":
            return "pending", "spawn requested", 0
        return "pending", event.message, event.progress
    if server.state == "stopped" and event is not None:
        if event.kind == "refused":
            return "refused", event.message, None
        if event.failure:
            return "failed", event.message, None
        if event.kind == "stopped":
            return "stopped", event.message, None
    return server.state, "", None


def server_matches(row: ServerView, states: set[str], search: str) -> bool:
    text = search.strip().lower()
    return (not states or row.state in states) and (not text or text in row.user.lower() or text in row.image.lower())


def duration_text(seconds: float | None) -> str:
    """'3 d 4 h', '2 h 5 min', '12 min', '40 s'; empty for None."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{s} s"


def wait_rows(stats: list[WaitStats]) -> list[dict[str, object]]:
    """The Overview's wait-time table: one row per day and class."""
    return [
        {
            "day": s.day,
            "class": s.group or "(no class)",
            "waits": s.waits,
            "placed": s.placed,
            "left without a GPU": s.waits - s.placed,
            "typical wait": duration_text(s.p50_s),
            "19 in 20 waited at most": duration_text(s.p95_s),
            "longest": duration_text(s.longest_s),
        }
        for s in stats
    ]


def wait_scope_text(manager: Manager, days: int) -> str:
    """Whose waits the viewer's table counts."""
    if manager.admin:
        whose = "every class"
    elif manager.classes:
        whose = f"your classes ({', '.join(sorted(manager.classes))}) and your own"
    else:
        whose = "your own requests only"
    return (
        f"How long requests waited in the GPU line, from joining it to getting a GPU or leaving, per day (UTC)"
        f" and class, over the last {days} days: {whose}. Typical: half of the waits were shorter."
    )


def cards_text(cards: float) -> str:
    """GPU cards as KAI counts them, as people say them: '1 GPU', '2.5 GPUs', '0.25 of a GPU'."""
    amount = f"{round(cards, 3):g}"
    if amount == "1":
        return "1 GPU"
    return f"{amount} of a GPU" if 0 < cards < 1 else f"{amount} GPUs"


def queue_figures(queue: ClassQueue) -> dict[str, str]:
    """A KAI queue's GPU quota and limit (-1: none) and what KAI counts in it, in words."""

    def bound(value: float | None, none: str) -> str:
        return "not set" if value is None else none if value < 0 else cards_text(value)

    asked = [cards_text(queue.requested_gpus)] if queue.requested_gpus else []
    if queue.requested_memory_bytes:
        asked.append(f"{format_bytes(queue.requested_memory_bytes)} of GPU memory")
    return {
        "GPU quota": bound(queue.gpu_quota, "unlimited"),
        "GPU limit": bound(queue.gpu_limit, "no limit"),
        "allocated": cards_text(queue.allocated_gpus) if queue.allocated_gpus else "nothing",
        "requested": " and ".join(asked) or "nothing",
    }


def queued_rows(waiting: tuple[QueuedPod, ...]) -> list[dict[str, str]]:
    """The pods KAI has not placed, with its reason; people outside the reader's scope unnamed."""
    return [
        {
            "student": w.user or "someone outside your classes",
            "server": (w.server or "(default)") if w.user else "",
            "why it waits": w.reason,
        }
        for w in waiting
    ]


def ago_text(when: datetime | None, now_ts: float) -> str:
    """'12 min ago', 'never' (the hub has no activity for a server never used)."""
    return "never" if when is None else duration_text(now_ts - when.timestamp()) + " ago"


def slice_text(row: ServerRow, hold: Held | None, *, failed: bool = False) -> str:
    """What the server holds: from the ledger while it runs, else what it asked for ("4 GiB", never "4GiB")."""
    if hold is not None:
        return "whole GPU" if hold.whole else format_bytes(hold.memory_bytes)
    if row.state == "stopped" and not failed:
        return ""
    if row.gpus:
        return f"{row.gpus} whole GPU{'' if row.gpus == 1 else 's'}"
    if row.gpu_memory in ("0", ""):
        return "CPU only"
    if not re.search(r"[A-Za-z]", row.gpu_memory):
        return f"{row.gpu_memory} of a GPU"  # a share of a card ("0.5")
    try:
        return format_bytes(parse_quantity(row.gpu_memory))
    except ShareError:
        return row.gpu_memory


def zone(name: str | None) -> tzinfo:
    """The reader's time zone, as their browser names it (st.context.timezone); UTC when unknown."""
    try:
        return ZoneInfo(name) if name else UTC
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def clock_text(timestamp: float, now_ts: float, where: tzinfo) -> str:
    """A time in the reader's zone, as short as it can be: "09:41", "yesterday 09:41", "Tue 24 Nov 09:41"."""
    when, now = datetime.fromtimestamp(timestamp, where), datetime.fromtimestamp(now_ts, where)
    suffix = "" if where is not UTC else " UTC"  # a reader whose zone is unknown reads which clock it is
    days = (now.date() - when.date()).days
    if days == 0:
        return f"{when:%H:%M}{suffix}"
    if days == 1:
        return f"yesterday {when:%H:%M}{suffix}"
    if days == -1:
        return f"tomorrow {when:%H:%M}{suffix}"
    return f"{when:%a %d %b %H:%M}{suffix}"


def when_text(timestamp: float, now_ts: float, where: tzinfo) -> str:
    """ "09:41 (in 4 min)", "09:12 (25 min ago)": the clock and how far off."""
    off = timestamp - now_ts
    if abs(off) < 60:
        away = "now"
    elif off > 0:
        away = f"in {duration_text(off)}"
    else:
        away = f"{duration_text(-off)} ago"
    return f"{clock_text(timestamp, now_ts, where)} ({away})"


def times_in_words(text: str, now_ts: float, where: tzinfo) -> str:
    """A message's instants (spawner/words.py) as the reader's clock and how far off."""
    return INSTANT.sub(lambda m: when_text(parse_instant(m.group(0)), now_ts, where), text)


EntryT = TypeVar("EntryT", bound=BaseModel)
_MARKDOWN_SPECIALS = "\\`*_{}[]()#+-.!|<>~$:"


def plain(text: str) -> str:
    """User-written text made inert for st.markdown: every markdown and HTML character escaped."""
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIALS else ch for ch in text).replace("\n", " ")


def image_matches(
    image: Image, search: str, frameworks: set[str], cudas: set[str], tags: set[str], max_gib: float
) -> bool:
    text = search.strip().lower()
    haystack = " ".join([image.slug, image.name, image.description, *image.tags, *image.contents]).lower()
    return (
        (not text or text in haystack)
        and (not frameworks or image.framework in frameworks)
        and (not cudas or (image.cuda or "none") in cudas)
        and (not tags or bool(tags & set(image.tags)))
        and image.size_bytes <= max_gib * 2**30
    )


def model_matches(model: Model, search: str, tasks: set[str], statuses: set[str]) -> bool:
    text = search.strip().lower()
    haystack = " ".join([model.slug, model.name, model.description, model.task, model.framework]).lower()
    return (
        (not text or text in haystack)
        and (not tasks or model.task in tasks)
        and (not statuses or model.status in statuses)
    )


def split_list(text: str) -> list[str]:
    """'a, b,,c ' -> ['a', 'b', 'c'] (form fields that hold lists)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def load_code(model: Model) -> str:
    """The model's load snippet with {path} as the mounted folder (environ.MODELS_DIR in the server)."""
    folder = f'Path(os.environ["{environ.MODELS_DIR.name}"]) / "{model.slug}"'
    code = model.load.replace("{path}", folder) if model.load else f"folder = {folder}\n"
    return "import os\nfrom pathlib import Path\n\n" + code


def validated(schema: type[EntryT], fields: dict[str, object]) -> tuple[EntryT | None, list[str]]:
    """A form's fields checked against the catalog schema: (entry, []) or (None, one message per field)."""
    try:
        return schema.model_validate(fields), []
    except ValidationError as exc:
        return None, [field_message(e) for e in exc.errors()]


FIELD_LABELS = {"id": "Id", "cuda": "CUDA version", "local": "Local environment", "container": "Container image"}
PATTERN_HINTS = {
    "id": "use lower-case letters, digits and '-', starting with a letter or digit (for example my-model-2)",
    "cuda": "write the version as major.minor, for example 12.4",
    "container": "write an image reference in lower case, for example ghcr.io/org/image:tag",
}


def field_message(error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence about the form's field, without the validator's jargon."""
    loc = [str(part) for part in error.get("loc", ()) if not isinstance(part, int)]
    field = loc[0] if loc else ""
    label = FIELD_LABELS.get(field, field.replace("_", " ").capitalize()) if field else "This entry"
    ctx = error.get("ctx") or {}
    kind = error.get("type", "")
    if kind == "missing" or (kind == "string_too_short" and ctx.get("min_length") == 1):
        return f"{label}: fill it in."
    if kind == "string_too_long":
        return f"{label}: at most {ctx.get('max_length')} characters."
    if kind == "string_pattern_mismatch":
        return f"{label}: {PATTERN_HINTS.get(field, 'it has characters that are not allowed here')}."
    if kind == "literal_error":
        return f"{label}: choose one of {str(ctx.get('expected', '')).replace(chr(39), '')}."
    if kind in ("string_type", "none_required", "model_type") and error.get("input") is None:
        return f"{label}: fill it in."
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{label}: {message[:1].lower() + message[1:]}" + ("" if message.endswith(".") else ".")


def review_text(status: str, proposed_by: str | None, reviewed_by: str | None, note: str) -> str:
    """'Rejected by dana: too big' (who reviewed it), 'Pending: proposed by carol'."""
    why = f": {note}" if note else ""
    if status in ("approved", "rejected") and reviewed_by:
        proposer = f" (proposed by {proposed_by})" if proposed_by else ""
        return f"{status.capitalize()} by {reviewed_by}{why}{proposer}"
    return f"{status.capitalize()}{': proposed by ' + proposed_by if proposed_by else ''}{why}"


_CODE = re.compile(r"`([^`\n]+)`")


def described(text: str) -> str:
    """A description for st.markdown: `code` spans as code, everything else inert (plain)."""
    parts = _CODE.split(text)
    return "".join(f"`{part}`" if index % 2 else plain(part) for index, part in enumerate(parts))


RUNBOOK_DOC = "docs/runbook.md"


def runbook_href(runbook: str) -> str:
    """Where an alert's runbook opens: a web address as it is; docs/runbook.md#x as the portal's Runbook page."""
    if runbook.startswith(("http://", "https://")):
        return runbook
    path, _, anchor = runbook.partition("#")
    if path == RUNBOOK_DOC:
        return "runbook" + (f"#{anchor}" if anchor else "")
    return ""


def reservation_rows(
    booked: Iterable[Reservation], now_ts: float, where: tzinfo, with_class: bool = True
) -> list[dict[str, str]]:
    """GPU memory reserved for classes, one row each, times in the reader's zone (the Servers page lists
    every class's; a class's Teaching page its own, without the class column)."""
    return [
        {
            **({"class": r.group} if with_class else {}),
            "GPU memory": format_bytes(r.memory_bytes),
            "from": clock_text(r.start, now_ts, where),
            "until": clock_text(r.end, now_ts, where),
            "by": r.by,
        }
        for r in booked
    ]
