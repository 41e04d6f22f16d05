import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from portal import said, views
from portal.data.errors import SourceUnavailableError
from portal.sources import classes, clients, line, servers
from spawner.ledger import ServerEvent
from spawner.line_admin import Waiting
from spawner.quotas import classes as class_rules
from spawner.shares import format_bytes, parse_quantity
from spawner.waitline import may_manage
from spawner.words import ordinal

identity = st.session_state["identity"]
where = views.zone(st.context.timezone)  # the reader's own clock
st.title("Servers")
left, right = st.columns([2, 1])
search = left.text_input("Search user or image")
states = set(right.multiselect("State", views.SERVER_STATES))


def _label(job: views.ServerView) -> str:
    return f"{job.user}/{job.server or '(default)'}"


def _act(action: Callable[[], object], done: str) -> None:
    """Run what the reader asked; a refusal (checked in the data layer or by the hub) shows here as an error."""
    said.act("page", action, done)
    said.show("page")


@st.fragment(run_every=clients.REFRESH_S)
def live_table() -> list[views.ServerView]:
    """The table and the reasons, re-read twice a second without reloading the page."""
    now = time.time()
    try:
        jobs = views.server_rows(
            servers.servers(identity), servers.inventory(identity)[1], servers.server_events(identity), now_ts=now
        )
    except SourceUnavailableError as exc:  # inside a fragment the app's handler does not see it
        st.error(f"{exc}. This page needs it; reload in a moment.")
        return []
    shown = [j for j in jobs if views.server_matches(j, states, search)]
    counts = {state: sum(j.state == state for j in jobs) for state in views.SERVER_STATES}
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
                "why": views.times_in_words(j.detail, now, where),
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
            "\n".join(
                f"- **{views.plain(_label(j))}** ({j.state}): {views.plain(views.times_in_words(j.detail, now, where))}"
                for j in explained
            )
        )
    return shown


shown = live_table() or []


def _draw_history(box: DeltaGenerator, history: list[ServerEvent]) -> None:
    if not history:  # a server that never started, or was asked for before the ledger kept events
        box.caption("Nothing is recorded for this server yet.")
        return
    now = time.time()
    box.dataframe(
        [
            {
                "when": views.clock_text(e.created, now, where),
                "event": e.kind,
                "message": views.times_in_words(e.message, now, where),
            }
            for e in history
        ],
        hide_index=True,
        width="stretch",
    )


# Read only once the reader opens it: a closed expander's code runs on every run of the page too, and
# this is a read of its own (the ledger, or the Kubernetes API) for a table the reader may never open.
history_box = st.expander("History of a server", on_change="rerun", key="history-open")
if history_box.open:
    chosen = history_box.selectbox("Server", shown, format_func=_label, key="history")
    if chosen is not None:
        try:
            _draw_history(history_box, servers.server_history(identity, chosen.user, chosen.server))
        except PermissionError as exc:
            history_box.error(str(exc))

stoppable = [j for j in shown if j.state in ("running", "pending") and (identity.admin or j.user == identity.name)]
if stoppable:
    choice = st.selectbox("Stop a server", stoppable, format_func=_label)
    server = (choice.user, choice.server) if choice is not None else None
    shown_before = said.seen("stop", server)
    if st.button("Stop", type="primary") and choice is not None and said.may_act("stop", "stop", server, shown_before):
        _act(lambda: servers.stop_server(identity, choice.user, choice.server), f"Stopping {_label(choice)}.")

manager = line.line_manager(identity)


def _waiting_label(w: Waiting) -> str:
    return f"{ordinal(w.position)}: {w.user}/{w.server or '(default)'}, {w.asked}"


@st.fragment(run_every=clients.REFRESH_S)
def live_queue() -> None:
    """The GPU line, re-read like the table above: someone placed leaves it within a second."""
    st.subheader("Queue", anchor="queue")
    try:
        waiting = line.waiting_line(identity)
    except SourceUnavailableError as exc:
        st.error(f"The queue cannot be read now: {exc}.")
        return
    if not waiting:
        st.caption("Nobody waits for a GPU." if manager.admin else "Nobody you can see waits for a GPU.")
        said.show("queue")  # the request just cancelled was the last
        return
    now = time.time()
    rows = [
        {
            "place": ordinal(w.position),
            "user": w.user,
            "server": w.server or "(default)",
            "asked for": w.asked,
            "class": w.group or "",
            "waiting for": views.duration_text(now - w.since),
            "expected start": views.when_text(w.estimated_start, now, where) if w.estimated_start else "not known",
            "note": "its page was closed when the hub restarted: starts when asked again" if w.away else "",
        }
        for w in waiting
    ]
    # A plain table: every word in the page itself (read aloud, found by a search), not drawn on a canvas.
    st.table(pd.DataFrame(rows).set_index("place"))
    st.caption(
        "Expected start: at the latest, when as many GPU servers as are ahead have stopped, each left idle"
        " until it is reclaimed for the line. Not known: fewer servers run than are ahead."
    )
    # Admins change any request; a class's teachers the requests charged to their class (the
    # hub checks again: these lists are only what to offer).
    manageable = [w for w in waiting if may_manage(manager, w.group) is None]
    if manageable:
        chosen_wait = st.selectbox("Waiting request", manageable, format_func=_waiting_label, key="waiting")
        request = (chosen_wait.user, chosen_wait.server) if chosen_wait is not None else None
        shown_before = said.seen("queue", request)
        first_col, cancel_col = st.columns(2)
        if first_col.button("Put first") and chosen_wait and said.may_act("queue", "first", request, shown_before):
            said.act(
                "queue",
                lambda: line.put_first(identity, chosen_wait.user, chosen_wait.server),
                f"{views.plain(chosen_wait.user)} goes first.",
            )
        if (
            cancel_col.button("Cancel the request")
            and chosen_wait
            and said.may_act("queue", "cancel", request, shown_before)
        ):
            said.act(
                "queue",
                lambda: line.cancel_waiting(identity, chosen_wait.user, chosen_wait.server),
                f"Cancelled: {views.plain(chosen_wait.user)}'s page will say you did.",
            )
    said.show("queue")


live_queue()

st.subheader("Reserved GPU memory")
booked = line.reservations(identity)
now = time.time()
if booked:
    st.dataframe(
        views.reservation_rows(booked, now, where),
        hide_index=True,
        width="stretch",
    )
else:
    st.caption("No GPU memory is reserved for a class.")

taught = sorted({rule.name for rule in class_rules(classes.group_rules())} if manager.admin else set(manager.classes))
if taught:
    with st.form("reserve"):
        st.caption("Keep GPU memory for a class's students for a time: others cannot take it meanwhile.")
        group = st.selectbox("Class", taught)
        size_text = st.text_input("GPU memory", "8 GiB")
        local_now = datetime.now(where)
        day = st.date_input("Day", local_now.date())
        start_time = st.time_input(f"From ({local_now:%Z} time)", local_now.time().replace(second=0, microsecond=0))
        hours = st.number_input("For hours", min_value=0.25, max_value=24.0, value=2.0, step=0.25)
        if st.form_submit_button("Reserve"):
            start = datetime.combine(day, start_time, tzinfo=where)
            try:
                size = parse_quantity(size_text.strip().replace(" ", ""))
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
