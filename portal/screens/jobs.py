import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import streamlit as st

from portal import views
from portal.data.errors import SourceUnavailableError
from portal.sources import classes, clients, line, servers
from spawner.line_admin import Waiting
from spawner.shares import format_bytes, parse_quantity
from spawner.waitline import may_manage

identity = st.session_state["identity"]
st.title("Jobs")
left, right = st.columns([2, 1])
search = left.text_input("Search user or image")
states = set(right.multiselect("State", views.JOB_STATES))


def _label(job: views.JobRow) -> str:
    return f"{job.user}/{job.server or '(default)'}"


def _act(action: Callable[[], object], done: str) -> None:
    """Run what the reader asked; a refusal (checked in the data layer) shows as an error."""
    try:
        action()
    except PermissionError as exc:
        st.error(str(exc))
    else:
        st.success(done)


@st.fragment(run_every=clients.REFRESH_S)
def live_table() -> list[views.JobRow]:
    """The table and the reasons, re-read twice a second without reloading the page."""
    now = time.time()
    try:
        jobs = views.job_rows(
            servers.servers(identity), servers.inventory(identity)[1], servers.server_events(identity), now_ts=now
        )
    except SourceUnavailableError as exc:  # inside a fragment the app's handler does not see it
        st.error(f"{exc}. This page needs it; reload in a moment.")
        return []
    shown = [j for j in jobs if views.job_matches(j, states, search)]
    counts = {state: sum(j.state == state for j in jobs) for state in views.JOB_STATES}
    st.caption(" · ".join(f"{n} {state}" for state, n in counts.items() if n) or "No servers yet.")
    st.dataframe(
        [
            {
                "user": j.user,
                "server": j.server or "(default)",
                "state": j.state,
                "slice": j.slice,
                "image": j.image,
                "age": views.duration_text(j.age_s),
                "idle": views.duration_text(j.idle_s),
                "progress": j.progress,
                "why": j.detail,
                "last activity": views.ago_text(j.last_activity, now),
            }
            for j in shown
        ],
        hide_index=True,
        width="stretch",
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=100, format="%d%%"),
            "why": st.column_config.TextColumn("why", width="medium"),
        },
    )
    explained = [j for j in shown if j.detail and j.state in ("pending", "refused", "failed", "stopped")]
    if explained:  # the full reason, wrapped: a table cell cuts it at its width
        st.markdown(
            "\n".join(f"- **{views.plain(_label(j))}** ({j.state}): {views.plain(j.detail)}" for j in explained)
        )
    return shown


shown = live_table() or []

with st.expander("History of a server"):
    chosen = st.selectbox("Server", shown, format_func=_label, key="history")
    if chosen is not None:
        try:
            history = servers.server_history(identity, chosen.user, chosen.server)
        except PermissionError as exc:
            st.error(str(exc))
        else:
            st.dataframe(
                [{"when": views.local_time(e.created), "event": e.kind, "message": e.message} for e in history],
                hide_index=True,
                width="stretch",
            )

stoppable = [j for j in shown if j.state in ("running", "pending") and (identity.admin or j.user == identity.name)]
if stoppable:
    choice = st.selectbox("Stop a server", stoppable, format_func=_label)
    if st.button("Stop", type="primary") and choice is not None:
        _act(lambda: servers.stop_server(identity, choice.user, choice.server), f"Stopping {_label(choice)}.")

st.subheader("Queue")
waiting = line.waiting_line(identity)
if not waiting:
    st.caption("Nobody waits for a GPU." if identity.admin else "You are not waiting for a GPU.")
else:
    st.dataframe(
        [
            {
                "position": w.position,
                "user": w.user,
                "server": w.server or "(default)",
                "asked for": w.asked,
                "group": w.group or "",
                "since": views.local_time(w.since),
                "waiting": views.duration_text(time.time() - w.since),
                "estimated start": views.local_time(w.estimated_start) if w.estimated_start is not None else None,
                "note": "spawn lost (hub restarted?): keeps its place, starts when asked again" if w.away else "",
            }
            for w in waiting
        ],
        hide_index=True,
        width="stretch",
    )
    st.caption(
        "Estimated start: the hub's estimate, when as many GPU servers as are ahead will have ended"
        " at the latest if left idle (the GPU idle timeout). Empty when unknown: the spawn is not"
        " waiting in this hub (hub restarted), or fewer GPU servers run than are ahead."
    )

manager = line.line_manager(identity)


def _waiting_label(w: Waiting) -> str:
    return f"{w.position}. {w.user}/{w.server or '(default)'}: {w.asked}"


# Admins change any request; a class's teachers the requests charged to their class (the
# data layer checks again inside the ledger's transaction: these lists are only what to offer).
manageable = [w for w in waiting if may_manage(manager, w.group) is None]
if manageable:
    chosen_wait = st.selectbox("Waiting request", manageable, format_func=_waiting_label, key="waiting")
    first_col, cancel_col = st.columns(2)
    if first_col.button("Put first") and chosen_wait is not None:
        _act(
            lambda: line.put_first(identity, chosen_wait.user, chosen_wait.server),
            f"{views.plain(chosen_wait.user)} goes first.",
        )
    if cancel_col.button("Cancel the request") and chosen_wait is not None:
        _act(
            lambda: line.cancel_waiting(identity, chosen_wait.user, chosen_wait.server),
            f"Cancelled: {views.plain(chosen_wait.user)}'s page will say you did.",
        )

st.subheader("Reserved GPU memory")
booked = line.reservations(identity)
if booked:
    st.dataframe(
        [
            {
                "class": r.group,
                "GPU memory": format_bytes(r.memory_bytes),
                "from": views.local_time(r.start),
                "until": views.local_time(r.end),
                "by": r.by,
            }
            for r in booked
        ],
        hide_index=True,
        width="stretch",
    )
else:
    st.caption("No GPU memory is reserved for a class.")

taught = sorted(
    {str(rule.get("name", "")) for rule in classes.group_rules()} if manager.admin else set(manager.classes)
)
if taught:
    with st.form("reserve"):
        st.caption("Keep GPU memory for a class's students for a time (UTC): others cannot take it meanwhile.")
        group = st.selectbox("Class", taught)
        size_text = st.text_input("GPU memory", "8GiB")
        now_utc = datetime.now(UTC)
        day = st.date_input("Day", now_utc.date())
        start_time = st.time_input("From (UTC)", now_utc.time().replace(second=0, microsecond=0))
        hours = st.number_input("For hours", min_value=0.25, max_value=24.0, value=2.0, step=0.25)
        if st.form_submit_button("Reserve"):
            start = datetime.combine(day, start_time, tzinfo=UTC)
            try:
                size = parse_quantity(size_text.strip())
                end = start + timedelta(hours=hours)
                line.reserve(identity, group or "", size, start.timestamp(), end.timestamp())
            except (ValueError, PermissionError) as exc:  # a size that is not one, a window that does not fit
                st.error(f"Not reserved: {exc}")
            else:
                st.success(f"Reserved {format_bytes(size)} for {group}.")
    mine = [r for r in booked if manager.admin or r.group in manager.classes]
    if mine:
        dropped = st.selectbox(
            "Reservation", mine, format_func=lambda r: f"{r.group}: {format_bytes(r.memory_bytes)}", key="dropped"
        )
        if st.button("Remove the reservation") and dropped is not None and dropped.id is not None:
            reservation, group_name = dropped.id, dropped.group
            _act(lambda: line.drop_reservation(identity, reservation), f"Removed the reservation for {group_name}.")
