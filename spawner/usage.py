"""Utilization reports: per user, class and week, GPU-hours allocated, used and held idle.

A GPU-hour is one whole card for one hour; a slice of 8 GiB on a 16 GiB card held for
an hour is half a GPU-hour. *Used* counts the time the slice's card was busy (DCGM
utilization at or above ``BUSY_PERCENT``) while the server had processes on it (the
exporter's per-process memory); *idle-held* is allocated minus used. The per-card
utilization is shared by the slices on a card, so a held slice next to a busy neighbour
counts as used only if its own server has a process on the card.

Pure functions over samples; ``samples_from_prometheus`` takes the query function of a
Prometheus client (``PrometheusConnect.custom_query_range``) as its argument.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from spawner.quotas import GroupRules

BUSY_PERCENT = 5
# The slice's share of its card, where Prometheus has it; and that share again, only at
# the times the card is busy and the server has a process on it.
ALLOCATED = "gpuslice_gpu_memory_allocated_bytes / on (node, gpu) group_left () gpuslice_gpu_memory_capacity_bytes"
USED = (
    f"({ALLOCATED})"
    ' and on (node, gpu) (label_replace(DCGM_FI_DEV_GPU_UTIL, "node", "$1", "Hostname", "(.*)")'
    f" >= {BUSY_PERCENT})"
    ' and on (node, gpu, user, server) (label_replace(gpuslice_process_gpu_memory_bytes{user!=""},'
    ' "node", "$1", "Hostname", "(.*)") > 0)'
)


@dataclass(frozen=True)
class Sample:
    """One server's slice of one card at one time: its share of the card, and whether it was in use."""

    time: float  # Unix seconds
    user: str
    server: str
    node: str
    gpu: str
    share: float  # allocated memory / card memory, 0..1
    used: bool


@dataclass(frozen=True)
class UsageRow:
    week: str  # ISO week, e.g. 2026-W48
    user: str
    group: str  # the class (group) the user is a member of, "" for none
    allocated_h: float
    used_h: float

    @property
    def idle_h(self) -> float:
        return self.allocated_h - self.used_h

    @property
    def used_ratio(self) -> float | None:
        return self.used_h / self.allocated_h if self.allocated_h else None


def iso_week(unix_s: float) -> str:
    year, week, _ = datetime.fromtimestamp(unix_s, UTC).isocalendar()
    return f"{year}-W{week:02d}"


def usage(samples: Iterable[Sample], step_s: float, group_of: Mapping[str, str]) -> list[UsageRow]:
    """GPU-hours per (week, user): each sample stands for ``step_s`` seconds of its slice."""
    allocated: dict[tuple[str, str], float] = {}
    used: dict[tuple[str, str], float] = {}
    hours = step_s / 3600
    for s in samples:
        key = (iso_week(s.time), s.user)
        allocated[key] = allocated.get(key, 0.0) + s.share * hours
        if s.used:
            used[key] = used.get(key, 0.0) + s.share * hours
    return [
        UsageRow(
            week, user, group_of.get(user, ""), round(allocated[week, user], 3), round(used.get((week, user), 0.0), 3)
        )
        for week, user in sorted(allocated)
    ]


def by_group(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """The same figures summed per (week, class); user is "*"."""
    totals: dict[tuple[str, str], tuple[float, float]] = {}
    for r in rows:
        a, u = totals.get((r.week, r.group), (0.0, 0.0))
        totals[r.week, r.group] = (a + r.allocated_h, u + r.used_h)
    return [UsageRow(week, "*", group, round(a, 3), round(u, 3)) for (week, group), (a, u) in sorted(totals.items())]


def worst_holders(rows: Iterable[UsageRow], week: str, count: int = 10) -> list[UsageRow]:
    """Who held the most GPU-hours idle in a week, most first (ties: by name)."""
    held = [r for r in rows if r.week == week and r.idle_h > 0]
    return sorted(held, key=lambda r: (-r.idle_h, r.user))[:count]


def trend(rows: Iterable[UsageRow]) -> list[tuple[str, float, float]]:
    """(week, allocated, used) over the whole platform, oldest first."""
    totals: dict[str, tuple[float, float]] = {}
    for r in rows:
        a, u = totals.get(r.week, (0.0, 0.0))
        totals[r.week] = (a + r.allocated_h, u + r.used_h)
    return [(week, round(a, 3), round(u, 3)) for week, (a, u) in sorted(totals.items())]


def to_csv(rows: Iterable[UsageRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["week", "user", "class", "gpu_hours_allocated", "gpu_hours_used", "gpu_hours_idle_held"])
    for r in rows:
        writer.writerow([r.week, r.user, r.group, f"{r.allocated_h:.3f}", f"{r.used_h:.3f}", f"{r.idle_h:.3f}"])
    return out.getvalue()


def group_members(groups: Iterable[GroupRules]) -> dict[str, str]:
    """user -> the first class (settings ``groups``) that lists them as a member."""
    found: dict[str, str] = {}
    for group in groups:
        for member in group.members:
            found.setdefault(member, group.name)
    return found


QueryRange = Callable[[str, datetime, datetime, str], list[dict]]  # type: ignore[type-arg]


def samples_from_prometheus(query_range: QueryRange, start: datetime, end: datetime, step_s: int) -> list[Sample]:
    """Every slice at every step from ``start`` to ``end``, from two range queries."""
    step = f"{step_s}s"
    used = {
        (_key(series["metric"]), float(t))
        for series in query_range(USED, start, end, step)
        for t, _ in series["values"]
    }
    samples = []
    for series in query_range(ALLOCATED, start, end, step):
        user, server, node, gpu = key = _key(series["metric"])
        for t, value in series["values"]:
            samples.append(Sample(float(t), user, server, node, gpu, float(value), (key, float(t)) in used))
    return samples


def _key(metric: Mapping[str, str]) -> tuple[str, str, str, str]:
    return (metric.get("user", ""), metric.get("server", ""), metric.get("node", ""), metric.get("gpu", ""))


def idle_notices(rows: Iterable[UsageRow], week: str, min_idle_h: float) -> dict[str, str]:
    """The weekly notice to each user who held at least ``min_idle_h`` GPU-hours idle in ``week``: user -> text."""
    notices = {}
    for r in rows:
        if r.week != week or r.user == "*" or r.idle_h < min_idle_h:
            continue
        used = f" ({r.used_ratio:.0%} of it)" if r.used_ratio is not None else ""
        notices[r.user] = (
            f"Hello {r.user},\n\n"
            f"in {week} your notebook servers held {r.allocated_h:.1f} GPU-hours of GPU slices and used"
            f" {r.used_h:.1f}{used}; {r.idle_h:.1f} GPU-hours were held without running anything on the GPU.\n"
            "A held slice is GPU memory nobody else can have, and others wait for it. Please stop your server"
            " when you are not computing (File > Hub Control Panel > Stop My Server) and start it again when"
            " you need it: your files stay.\n\n"
            "(A GPU-hour is one whole card for an hour; this notice goes to everyone who held at least"
            f" {min_idle_h:g} GPU-hours idle in a week.)\n"
        )
    return notices
