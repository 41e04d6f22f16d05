"""Alertmanager routes for an on-call rotation with escalation (pure: settings in, config out).

Alertmanager has no "acknowledge": an acknowledgement is a silence. Escalation is built
on that: the first line's route waits ``first_page_after`` (its ``group_wait``: long enough
for a cause that another rule group fires a little later to inhibit its effects), the second
line's ``first_page_after + escalate_after``, and Alertmanager drops silenced alerts before it
notifies, so an incident the first line acknowledged in time never reaches the second line;
the owner's route waits ``first_page_after + owner_after`` the same way. Who is first line is
a time interval per person (Alertmanager's ``time_intervals``), written out for the weeks ahead; warnings are only
sent in business hours (they wait for the next one), critical alerts at any hour.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from hub.settings import WEEKDAYS, Contact, OnCall, duration_s

HORIZON_DAYS = 26 * 7  # rotation turns written ahead; `gpuslice up` writes the config afresh at each start
AFTER_HOURS = "after-hours"
HEARTBEAT = "Watchdog"


def interval_name(contact: Contact) -> str:
    return f"oncall-{contact.name}"


def receiver(name: str, contact: Contact | None, send_resolved: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if contact and contact.webhook_url:
        out["webhook_configs"] = [{"url": contact.webhook_url, "send_resolved": send_resolved}]
    if contact and contact.email:
        out["email_configs"] = [{"to": contact.email, "send_resolved": send_resolved}]
    return out


def rotation_turns(oncall: OnCall, today: date, horizon_days: int = HORIZON_DAYS) -> list[tuple[Contact, date, date]]:
    """(who, first day, last day) of every turn that overlaps today .. today + horizon."""
    if not oncall.rotation:
        return []
    length = timedelta(days=oncall.rotation_days)
    turn = max(0, (today - oncall.rotation_start).days // oncall.rotation_days)
    turns = []
    while (start := oncall.rotation_start + turn * length) <= today + timedelta(days=horizon_days):
        turns.append((oncall.rotation[turn % len(oncall.rotation)], start, start + length - timedelta(days=1)))
        turn += 1
    return turns


def date_ranges(first: date, last: date, location: str) -> list[dict[str, Any]]:
    """Alertmanager time ranges covering first..last, split at month ends (a range names one month)."""
    ranges = []
    day = first
    while day <= last:
        month_end = (day.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)
        end = min(last, month_end)
        ranges.append(
            {
                "years": [str(day.year)],
                "months": [str(day.month)],
                "days_of_month": [f"{day.day}:{end.day}"],
                "location": location,
            }
        )
        day = end + timedelta(days=1)
    return ranges


def days_off(business_days: str) -> list[str]:
    """The weekdays outside a range like monday:friday (Alertmanager's weekday syntax)."""
    first, _, last = business_days.partition(":")
    start, end = WEEKDAYS.index(first), WEEKDAYS.index(last or first)
    working = {WEEKDAYS[(start + i) % 7] for i in range((end - start) % 7 + 1)}
    return [day for day in WEEKDAYS if day not in working]


def time_intervals(oncall: OnCall, today: date) -> list[dict[str, Any]]:
    start, end = oncall.business_hours.split("-")
    after: list[dict[str, Any]] = [
        {
            "times": [{"start_time": "00:00", "end_time": start}, {"start_time": end, "end_time": "24:00"}],
            "location": oncall.timezone,
        }
    ]
    if off := days_off(oncall.business_days):
        after.append({"weekdays": off, "location": oncall.timezone})
    intervals: list[dict[str, Any]] = [{"name": AFTER_HOURS, "time_intervals": after}]
    by_person: dict[str, list[dict[str, Any]]] = {}
    for contact, first, last in rotation_turns(oncall, today):
        by_person.setdefault(contact.name, []).extend(date_ranges(first, last, oncall.timezone))
    for contact in oncall.rotation:
        # Someone with no turn in the horizon still needs an interval for their route: one in the past.
        ranges = by_person.get(contact.name) or [{"years": ["1970"], "location": oncall.timezone}]
        intervals.append({"name": interval_name(contact), "time_intervals": ranges})
    return intervals


def after(*durations: str) -> str:
    """Alertmanager durations added up (one of its durations, in seconds)."""
    return f"{int(sum(duration_s(d) for d in durations))}s"


def escalation(oncall: OnCall, repeat: str, *, owner: bool, mute: list[str]) -> list[dict[str, Any]]:
    """First line after the first page's wait (whoever's turn it is), second line and owner that
    much later than their waits: each wait counts from the first page."""

    def route(name: str, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"receiver": name, "repeat_interval": repeat, "continue": True, **extra}
        if mute:
            out["mute_time_intervals"] = mute
        return out

    routes = [route(f"first-line-{c.name}", active_time_intervals=[interval_name(c)]) for c in oncall.rotation]
    if oncall.second_line:
        routes.append(route("second-line", group_wait=after(oncall.first_page_after, oncall.escalate_after)))
    if owner and oncall.owner:
        routes.append(route("owner", group_wait=after(oncall.first_page_after, oncall.owner_after)))
    if routes:
        routes[-1]["continue"] = False
    return routes


def oncall_routes(oncall: OnCall) -> list[dict[str, Any]]:
    """The severity routes: critical pages at any hour and escalates to the owner; warnings wait for business hours."""
    routes = []
    if oncall.deadman_url:
        routes.append(heartbeat_route())
    critical = escalation(oncall, oncall.critical_repeat, owner=True, mute=[])
    warning = escalation(oncall, oncall.warning_repeat, owner=False, mute=[AFTER_HOURS])
    for severity, tiers in (("critical", critical), ("warning", warning)):
        if tiers:
            matchers = [f'severity="{severity}"']
            routes.append(
                {"matchers": matchers, "receiver": "default", "group_wait": oncall.first_page_after, "routes": tiers}
            )
    return routes


def heartbeat_route() -> dict[str, Any]:
    """The Watchdog goes to the dead man's switch every minute and nowhere else."""
    return {
        "matchers": [f'alertname="{HEARTBEAT}"'],
        "receiver": "deadman",
        "group_wait": "0s",
        "group_interval": "1m",
        "repeat_interval": "1m",
    }


def oncall_receivers(oncall: OnCall) -> list[dict[str, Any]]:
    receivers = [receiver(f"first-line-{c.name}", c) for c in oncall.rotation]
    if oncall.second_line:
        receivers.append(receiver("second-line", oncall.second_line))
    if oncall.owner:
        receivers.append(receiver("owner", oncall.owner))
    deadman = Contact(name="deadman", webhook_url=oncall.deadman_url) if oncall.deadman_url else None
    receivers.append(receiver("deadman", deadman, send_resolved=False))
    return receivers


def smtp_globals(oncall: OnCall, password: str | None = None) -> dict[str, Any]:
    """The relay of alert mails; ``password`` (read from smtp_auth_password_file by the caller) logs in over TLS."""
    if not (oncall.smtp_smarthost and oncall.smtp_from):
        return {}
    out: dict[str, Any] = {"smtp_smarthost": oncall.smtp_smarthost, "smtp_from": oncall.smtp_from}
    if oncall.smtp_auth_username and password is not None:
        out |= {"smtp_auth_username": oncall.smtp_auth_username, "smtp_auth_password": password}
        out["smtp_require_tls"] = True  # Alertmanager's default, said aloud: never a login in clear
    return out
