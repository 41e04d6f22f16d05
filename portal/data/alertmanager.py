"""Alertmanager (the one module for it): its API v2 and its webhook's body.

The Alerts page's rows; for the incident recorder the alerts with their inhibitions and
silences, the silences, and a webhook notification read into alerts; acknowledging (a
silence). Takes its HTTP session (requests) so that tests hand it the real Alertmanager;
the platform passes its monitoring credentials (basic auth) in ``auth``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import requests

from portal.data.errors import why
from portal.data.prometheus import MetricsUnavailableError
from portal.incidents import HEARTBEAT, Alert, Incident, Notification, Silence

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class AlertRow:
    """One firing alert as the Alerts page lists it."""

    name: str
    severity: str
    summary: str
    description: str
    runbook: str
    started: datetime | None
    state: str


def _time(text: str) -> datetime:
    """A time as Alertmanager writes it, to the millisecond: its API writes milliseconds, its webhook
    every digit it has, and the two must name the same alert episode."""
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def alert_from_api(raw: dict[str, Any]) -> Alert:
    """An alert as the API v2 lists it (``status`` an object) or a webhook carries it (``status``
    "firing" or "resolved"; a resolved one ends at its ``endsAt``)."""
    status = raw.get("status")
    details = status if isinstance(status, dict) else {}
    annotations = raw.get("annotations") or {}
    ends = raw.get("endsAt")
    return Alert(
        fingerprint=str(raw.get("fingerprint", "")),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        started=_time(raw["startsAt"]),
        summary=str(annotations.get("summary", "")),
        runbook=str(annotations.get("runbook", "")),
        inhibited_by=tuple(details.get("inhibitedBy") or ()),
        silenced_by=tuple(details.get("silencedBy") or ()),
        ended=_time(ends) if status == "resolved" and ends else None,
    )


def row_from_api(raw: dict[str, Any]) -> AlertRow:
    labels, annotations = raw.get("labels") or {}, raw.get("annotations") or {}
    return AlertRow(
        name=labels.get("alertname", "?"),
        severity=labels.get("severity", "none"),
        summary=annotations.get("summary", ""),
        description=annotations.get("description", ""),
        runbook=annotations.get("runbook", ""),
        started=_time(raw["startsAt"]) if raw.get("startsAt") else None,
        state=(raw.get("status") or {}).get("state", "active"),
    )


def silence_from_api(raw: dict[str, Any]) -> Silence:
    matchers = {
        str(m["name"]): str(m["value"])
        for m in raw.get("matchers") or ()
        if not m.get("isRegex") and m.get("isEqual", True)
    }
    return Silence(
        id=str(raw.get("id", "")),
        created_by=str(raw.get("createdBy", "")),
        comment=str(raw.get("comment", "")),
        starts=_time(raw["startsAt"]),
        matchers=matchers,
        ends=_time(raw["endsAt"]) if raw.get("endsAt") else None,
        state=str((raw.get("status") or {}).get("state", "")),
    )


class PayloadError(ValueError):
    """A webhook body that is not Alertmanager's (version 4): refused, nothing written."""


def notification_from_webhook(body: Any, at: datetime) -> tuple[Notification, list[Alert]]:
    """Alertmanager's webhook body (version 4) as one notification, arrived ``at``, and its alerts."""
    if not isinstance(body, dict) or body.get("version") != "4" or not isinstance(body.get("alerts"), list):
        raise PayloadError("not an Alertmanager webhook notification (version 4 with alerts)")
    try:
        alerts = [alert_from_api(raw) for raw in body["alerts"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PayloadError(f"an alert without labels or a valid startsAt ({exc})") from None
    firing = tuple(a.key for a in alerts if a.ended is None)
    resolved = tuple(a.key for a in alerts if a.ended is not None)
    return Notification(str(body.get("receiver", "")), at, firing, resolved), alerts


@dataclass
class Alertmanager:
    url: str
    session: requests.Session = field(default_factory=requests.Session)
    auth: tuple[str, str] | None = None
    timeout_s: float = 5

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.session.request(
                method, f"{self.url.rstrip('/')}/api/v2/{path}", timeout=self.timeout_s, auth=self.auth, **kwargs
            )
            response.raise_for_status()
            return response.json()
        except (requests.RequestException, ValueError) as exc:
            raise MetricsUnavailableError(f"Alertmanager did not answer ({why(exc)})") from exc

    def rows(self) -> list[AlertRow]:
        """The firing alerts for the Alerts page, most severe first, without the heartbeat."""
        rows = [row_from_api(a) for a in self._call("GET", "alerts")]
        rows = [r for r in rows if r.name != HEARTBEAT]
        return sorted(rows, key=lambda r: (SEVERITY_ORDER.get(r.severity, 3), r.name))

    def alerts(self) -> list[Alert]:
        """Every firing alert, inhibited and silenced ones too (they belong to incidents)."""
        return [alert_from_api(a) for a in self._call("GET", "alerts")]

    def silences(self) -> list[Silence]:
        """Active and expired silences (an expired acknowledgement still belongs on the timeline)."""
        return [
            silence_from_api(s) for s in self._call("GET", "silences") if s.get("status", {}).get("state") != "pending"
        ]

    def acknowledge(self, incident: Incident, by: str, comment: str, hours: float, now: datetime) -> str:
        """A silence of the incident's place under the admin's name; its id."""
        if not by:
            raise ValueError("an acknowledgement needs the admin's name")
        silence = {
            "matchers": [
                {"name": k, "value": v, "isRegex": False, "isEqual": True}
                for k, v in incident.silence_matchers().items()
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=hours)).isoformat(),
            "createdBy": by,
            "comment": comment or f"acknowledged incident {incident.title}",
        }
        return str(self._call("POST", "silences", json=silence)["silenceID"])
