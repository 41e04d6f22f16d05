"""Incidents from alerts: which alerts share a cause, and what happened to them (pure, no I/O).

Alertmanager already knows some causes: an alert it inhibits names the alerts that
inhibit it (``inhibitedBy``: a node down explains its GPUs' alerts, an exporter down the
missing GPU data). The portal adds what Alertmanager cannot express: alerts on one card
(same node and GPU) are one incident, and a node-level alert takes in every alert on that
node. The timeline is built from the alerts, the silences (an acknowledgement is a silence
under the admin's name), the escalation times of the on-call settings and the time the
portal saw the incident end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Alert:
    """One alert as Alertmanager's API v2 returns it."""

    fingerprint: str
    labels: dict[str, str]
    started: datetime
    summary: str = ""
    runbook: str = ""
    inhibited_by: tuple[str, ...] = ()
    silenced_by: tuple[str, ...] = ()

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

    def silence_matchers(self) -> dict[str, str]:
        """What an acknowledgement silences: the node (and card) of the incident, else its root alert."""
        node, gpu = self.root.labels.get("node"), self.root.labels.get("gpu")
        if node:
            return {"node": node, "gpu": gpu} if gpu else {"node": node}
        return {"alertname": self.root.name}


@dataclass(frozen=True)
class Event:
    at: datetime
    what: str  # firing, acknowledged, escalated, resolved
    text: str


def group(alerts: Iterable[Alert]) -> list[Incident]:
    """Alerts joined into incidents: Alertmanager's inhibitions first, then same card, then same node."""
    listed = [a for a in alerts if a.name != "Watchdog"]  # the heartbeat is no incident
    parent = {a.fingerprint: a.fingerprint for a in listed}

    def find(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def join(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    first_on: dict[tuple[str, str], str] = {}  # (node, gpu or ""): the first alert seen there
    for alert in listed:
        for cause in alert.inhibited_by:
            if cause in parent:
                join(alert.fingerprint, cause)
        node = alert.labels.get("node")
        if node:
            place = (node, alert.labels.get("gpu", ""))
            join(alert.fingerprint, first_on.setdefault(place, alert.fingerprint))
    # A node-level alert (no gpu label) takes in every card's alert on that node.
    for alert in listed:
        node = alert.labels.get("node")
        if node and (node, "") in first_on:
            join(alert.fingerprint, first_on[(node, "")])
    members: dict[str, list[Alert]] = {}
    for alert in listed:
        members.setdefault(find(alert.fingerprint), []).append(alert)
    incidents = [Incident(tuple(sorted(m, key=lambda a: (a.started, a.name)))) for m in members.values()]
    return sorted(incidents, key=lambda i: (SEVERITY_ORDER.get(i.severity, 3), i.started))


@dataclass(frozen=True)
class Escalation:
    """The on-call tiers' waits: who is paged when nobody acknowledges."""

    second_line: str = ""
    escalate_after_s: float = 0
    owner: str = ""
    owner_after_s: float = 0


def acknowledgements(incident: Incident, silences: Sequence[Silence]) -> list[Silence]:
    """The silences that cover one of the incident's alerts while it fired, oldest first (expired ones too).

    A silence that had ended before the incident began (an earlier incident's, on the same
    card) is not an acknowledgement of this one.
    """
    during = [s for s in silences if s.ends is None or s.ends > incident.started]
    return sorted((s for s in during if any(s.covers(a) for a in incident.alerts)), key=lambda s: s.starts)


def timeline(
    incident: Incident,
    silences: Sequence[Silence],
    escalation: Escalation,
    now: datetime,
    resolved_at: datetime | None = None,
) -> list[Event]:
    """What happened, in order: each alert firing, acknowledgements, escalations that were due, the end."""
    events = [
        Event(a.started, "firing", f"{a.name} fired" + (f" ({a.where})" if a.where else "")) for a in incident.alerts
    ]
    acks = acknowledgements(incident, silences)
    first_ack = max(acks[0].starts, incident.started) if acks else None
    for ack in acks:
        said = f": {ack.comment}" if ack.comment else ""
        at = max(ack.starts, incident.started)  # a silence made beforehand (maintenance) counts from the start
        events.append(Event(at, "acknowledged", f"acknowledged by {ack.created_by}{said}"))
    end = min(t for t in (first_ack, resolved_at, now) if t is not None)
    tiers = [(escalation.second_line, escalation.escalate_after_s, "second line")]
    if incident.severity == "critical":
        tiers.append((escalation.owner, escalation.owner_after_s, "owner"))
    for who, after_s, tier in tiers:
        due = incident.started + timedelta(seconds=after_s)
        if who and after_s > 0 and due <= end:
            events.append(Event(due, "escalated", f"not acknowledged in time: escalated to the {tier} ({who})"))
    if resolved_at is not None:
        events.append(Event(resolved_at, "resolved", "resolved: no alert of this incident fires any more"))
    order = {"firing": 0, "acknowledged": 1, "escalated": 2, "resolved": 3}
    return sorted(events, key=lambda e: (e.at, order[e.what]))
