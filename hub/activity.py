"""Activity is never in the future: the hub keeps at most its own clock's now.

A notebook server reports its last activity to the hub (``POST /hub/api/users/NAME/activity``),
with its own token, which its owner can read in the server's environment. JupyterHub refuses
a timestamp more than an hour ahead and keeps the rest, so one post of "59 minutes from now"
made an idle server look busy for an hour (the portal showed "idle 0 s", JupyterHub's admin
page "-3267 seconds ago"), and repeated, forever: the GPU line's reclaimer never took the slice.

``clamp_future_activity`` makes every write of a user's or a server's ``last_activity`` in
the hub's database at most now, whoever writes it (the activity API, the proxy's traffic,
a spawner). It listens on JupyterHub's ORM attributes rather than replacing its activity
handler, so it holds however JupyterHub's handlers change. A forged timestamp then buys
what any real activity report buys: idle from now on. What remains (a process that keeps
reporting) is bounded by the class's ``max_hold`` (hub/reclaimer.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event

log = logging.getLogger("gpuslice.activity")


def at_most_now(stamp: datetime | None, now: datetime) -> datetime | None:
    """``stamp``, or ``now`` when it is later (``now`` in the stamp's kind: naive UTC as JupyterHub keeps
    it, or aware)."""
    if stamp is None:
        return None
    now = now.astimezone(UTC)
    now = now if stamp.tzinfo else now.replace(tzinfo=None)
    return now if stamp > now else stamp


def _clamp(target: Any, value: datetime | None, oldvalue: Any, initiator: Any) -> datetime | None:
    kept = at_most_now(value, datetime.now(UTC))
    if kept is not value:
        who = getattr(target, "name", "") or getattr(getattr(target, "user", None), "name", "?")
        log.warning("gpuslice: activity of %r reported %s ahead of now; kept as now", who, value - kept)  # type: ignore[operator]
    return kept


def clamp_future_activity() -> None:
    """From now on in this process, JupyterHub's users' and servers' ``last_activity`` is never later than now."""
    from jupyterhub import orm

    for attribute in (orm.User.last_activity, orm.Spawner.last_activity):
        if not event.contains(attribute, "set", _clamp):
            event.listen(attribute, "set", _clamp, retval=True)
