"""Incidents from recorded alerts: which alerts share a cause, and what happened to them (pure, no I/O).

Alertmanager already knows some causes: an alert it inhibits names the alerts that
inhibit it (``inhibitedBy``: a node down explains its GPUs' alerts, an exporter down the
missing GPU data). The portal adds what Alertmanager cannot express: alerts on one card
(same node and GPU) are one incident, and a node-level alert takes in every alert on that
node, as long as their firing overlaps in time. The timeline is what the incident recorder
(portal/recorder.py) kept as it happened: each alert's start and end as Alertmanager gave
them (``startsAt``/``endsAt``), each notification Alertmanager sent and to which receiver
(its on-call tier), and the silences (an acknowledgement is a silence under the admin's name).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEARTBEAT = "Watchdog"  # the always-firing heartbeat of the alerting pipeline: never an incident
# The receiver whose route takes every alert for the recorder (hub/monitoring: RECORDER_RECEIVER);
# its notifications record alerts, they page nobody.
RECORDER_RECEIVER = "incident-recorder"
# The on-call tiers a notification to these receivers escalates to (hub/monitoring/oncall.py's names).
ESCALATION_TIERS = {"second-line": "the second line", "owner": "the owner"}


def micros(at: datetime) -> int:
    """A moment as whole microseconds since 1970 (exact, unlike a float of seconds): alerts' keys."""
    return (at - EPOCH) // timedelta(microseconds=1)


def from_micros(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


@dataclass(frozen=True)
class Alert:
    """One alert episode: Alertmanager's fingerprint (its labels) and start, and its end once known.

    ``ended``: Alertmanager's ``endsAt`` from a resolved notification (``end_exact``), or, for
    an alert Alertmanager never sends resolved (silenced, inhibited or muted when it ended),
    the first moment the recorder saw it gone from Alertmanager's API.
    """

    fingerprint: str
    labels: dict[str, str]
    started: datetime
    summary: str = ""
    runbook: str = ""
    inhibited_by: tuple[str, ...] = ()
    silenced_by: tuple[str, ...] = ()
    ended: datetime | None = None
    end_exact: bool = True

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "?")

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "none")

    @property
    def where(self) -> str:
        """The place it is about: node and GPU when it has them."""
        parts = [f"{k} {self.labels[k]}" for k in ("node", "gpu") if self.labels.get(k)]
        return ", ".join(parts)

    @property
    def key(self) -> tuple[str, int]:
        """One episode of one alert: the same labels firing again later is another episode."""
        return (self.fingerprint, micros(self.started))

    def overlaps(self, other: Alert) -> bool:
        return (self.ended is None or other.started <= self.ended) and (
            other.ended is None or self.started <= other.ended
        )


@dataclass(frozen=True)
class Silence:
    """An Alertmanager silence: who made it, when, and the labels it matches (equality matchers)."""

    id: str
    created_by: str
    comment: str
    starts: datetime
    matchers: dict[str, str]
    ends: datetime | None = None  # None: still in force
    state: str = "active"

    def covers(self, alert: Alert) -> bool:
        return bool(self.matchers) and all(alert.labels.get(k) == v for k, v in self.matchers.items())


@dataclass(frozen=True)
class Notification:
    """One webhook call Alertmanager made: to which receiver, when it arrived, which alert episodes it carried."""

    receiver: str
    at: datetime
    firing: tuple[tuple[str, int], ...] = ()  # Alert.key of each firing alert in it
    resolved: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Incident:
    """Alerts with one cause; ``root`` is the alert that explains the others."""

    alerts: tuple[Alert, ...]
    root: Alert = field(init=False)

    def __post_init__(self) -> None:
        uninhibited = [a for a in self.alerts if not a.inhibited_by] or list(self.alerts)
        root = min(uninhibited, key=lambda a: (SEVERITY_ORDER.get(a.severity, 3), a.started, a.name))
        object.__setattr__(self, "root", root)

    @property
    def id(self) -> str:
        """Stable while it lasts, new when the same cause fires again later: the root and its start."""
        return f"{self.root.fingerprint}-{int(self.root.started.timestamp())}"

    @property
    def title(self) -> str:
        return f"{self.root.name} on {self.root.where}" if self.root.where else self.root.name

    @property
    def severity(self) -> str:
        return min((a.severity for a in self.alerts), key=lambda s: SEVERITY_ORDER.get(s, 3))

    @property
    def started(self) -> datetime:
        return min(a.started for a in self.alerts)

    @property
    def resolved_at(self) -> datetime | None:
        """When its last alert ended; None while any fires."""
        ends = [a.ended for a in self.alerts]
        return None if any(e is None for e in ends) else max(e for e in ends if e is not None)

    @property
    def end_exact(self) -> bool:
        """The end is Alertmanager's own endsAt (not the moment the recorder saw the alert gone)."""
        last = max(self.alerts, key=lambda a: a.ended.timestamp() if a.ended else float("inf"))
        return last.end_exact

    def silence_matchers(self) -> dict[str, str]:
        """What an acknowledgement silences: the node (and card) of the incident, else its root alert."""
        node, gpu = self.root.labels.get("node"), self.root.labels.get("gpu")
        if node:
            return {"node": node, "gpu": gpu} if gpu else {"node": node}
        return {"alertname": self.root.name}


@dataclass(frozen=True)
class Event:
    at: datetime
    what: str  # firing, notified, escalated, acknowledged, resolved
    text: str


FNV_OFFSET, FNV_PRIME, SEPARATOR = 14695981039346656037, 1099511628211, 0xFF


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's fingerprint of an alert's labels (prometheus/common's LabelSet.Fingerprint:
    FNV-1a 64 over the sorted names and values, each followed by byte 255), as its API writes it."""
    value = FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                value = ((value ^ byte) * FNV_PRIME) % 2**64
            value = ((value ^ SEPARATOR) * FNV_PRIME) % 2**64
    return f"{value:016x}"


HISTORY_NOTE = "from Prometheus's history: the recorder was down while it fired"


def episodes_from_history(
    series: Sequence[tuple[dict[str, str], Sequence[float]]], step_s: float, until: datetime
) -> list[Alert]:
    """Alert episodes from Prometheus's ``ALERTS{alertstate="firing"}`` samples (labels, sample times):
    consecutive samples one step apart are one episode, from its first sample to one step after its
    last. An episode still firing at ``until`` is left out (Alertmanager's API lists it)."""
    found = []
    for labels, times in series:
        own = {k: v for k, v in labels.items() if k not in {"__name__", "alertstate"}}
        if own.get("alertname") == HEARTBEAT or not times:
            continue
        start = previous = times[0]
        for t in [*times[1:], math.inf]:
            if t - previous > step_s * 1.5:
                ended = datetime.fromtimestamp(previous + step_s, UTC)
                if ended < until:
                    found.append(
                        Alert(
                            fingerprint(own),
                            own,
                            datetime.fromtimestamp(start, UTC),
                            HISTORY_NOTE,
                            ended=ended,
                            end_exact=False,
                        )
                    )
                start = t
            previous = t
    return found


def _related(a: Alert, b: Alert) -> bool:
    """One cause: one inhibits the other, both on one card, or one is about the other's whole node."""
    if a.fingerprint in b.inhibited_by or b.fingerprint in a.inhibited_by:
        return True
    node = a.labels.get("node")
    if not node or node != b.labels.get("node"):
        return False
    gpu_a, gpu_b = a.labels.get("gpu", ""), b.labels.get("gpu", "")
    return gpu_a == gpu_b or not gpu_a or not gpu_b


def group(alerts: Iterable[Alert]) -> list[Incident]:
    """Alerts joined into incidents: related alerts (``_related``) whose firing overlaps in time."""
    listed = [a for a in alerts if a.name != HEARTBEAT]
    parent = list(range(len(listed)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(listed):
        for j in range(i):
            b = listed[j]
            if _related(a, b) and a.overlaps(b):
                parent[find(i)] = find(j)
    members: dict[int, list[Alert]] = {}
    for i, alert in enumerate(listed):
        members.setdefault(find(i), []).append(alert)
    incidents = [Incident(tuple(sorted(m, key=lambda a: (a.started, a.name)))) for m in members.values()]
    return sorted(incidents, key=lambda i: (i.resolved_at is not None, SEVERITY_ORDER.get(i.severity, 3), i.started))


def acknowledgements(incident: Incident, silences: Sequence[Silence]) -> list[Silence]:
    """The silences that cover one of the incident's alerts while it fired, oldest first (expired ones too).

    A silence that had ended before the incident began (an earlier incident's, on the same
    card) is not an acknowledgement of this one, nor one made after it ended.
    """
    end = incident.resolved_at
    during = [s for s in silences if (s.ends is None or s.ends > incident.started) and (end is None or s.starts <= end)]
    return sorted((s for s in during if any(s.covers(a) for a in incident.alerts)), key=lambda s: s.starts)


def _notified_words(receiver: str, names: list[str]) -> tuple[str, str]:
    what = ", ".join(names)
    tier = ESCALATION_TIERS.get(receiver)
    if tier:
        return "escalated", f"not acknowledged in time: Alertmanager notified {tier} ({receiver}) of {what}"
    return "notified", f"Alertmanager notified {receiver} of {what}"


def timeline(incident: Incident, notifications: Sequence[Notification], silences: Sequence[Silence]) -> list[Event]:
    """What happened, in order, as recorded: each alert firing, each receiver's first notification of
    each alert (the escalations among them), acknowledgements, and the end."""
    events = [
        Event(a.started, "firing", f"{a.name} fired" + (f" ({a.where})" if a.where else "")) for a in incident.alerts
    ]
    by_key = {a.key: a for a in incident.alerts}
    told: set[tuple[str, tuple[str, int]]] = set()  # (receiver, alert): only its first notification
    for note in sorted(notifications, key=lambda n: n.at):
        if note.receiver == RECORDER_RECEIVER:
            continue
        new = [k for k in note.firing if k in by_key and (note.receiver, k) not in told]
        told.update((note.receiver, k) for k in new)
        if new:
            what, text = _notified_words(note.receiver, [by_key[k].name for k in new])
            events.append(Event(note.at, what, text))
    for ack in acknowledgements(incident, silences):
        said = f": {ack.comment}" if ack.comment else ""
        at = max(ack.starts, incident.started)  # a silence made beforehand (maintenance) counts from the start
        events.append(Event(at, "acknowledged", f"acknowledged by {ack.created_by}{said}"))
    ended = incident.resolved_at
    if ended is not None:
        how = "" if incident.end_exact else " (seen gone from Alertmanager; it sent no end for a silenced alert)"
        events.append(Event(ended, "resolved", f"resolved: no alert of this incident fires any more{how}"))
    order = {"firing": 0, "notified": 1, "escalated": 2, "acknowledged": 3, "resolved": 4}
    return sorted(events, key=lambda e: (e.at, order[e.what]))
