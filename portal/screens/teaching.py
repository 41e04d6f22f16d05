"""A teacher's page: their class's roster, servers, line, budget, KAI queue, reservations and usage.

What it shows comes from the hub with the reader's own token (the hub answers only the
classes they teach; admins every class), and every change goes to the hub, which checks again.
"""

import csv
import io
import time
from collections.abc import Callable

import streamlit as st

from portal import said, views
from portal.data.errors import SourceUnavailableError
from portal.data.hub import ClassInfo
from portal.data.prometheus import MetricsUnavailableError
from portal.sources import classes, clients, line, metrics, servers
from spawner.quotas import read_group
from spawner.shares import format_bytes
from spawner.words import ordinal

identity = st.session_state["identity"]
where = views.zone(st.context.timezone)
st.title("Teaching")


def _act(action: Callable[[], object], done: str) -> object:
    """Run what the teacher asked; the hub's refusal (who may, a rule that cannot be) shows here as an error."""
    result = said.act("page", action, done)
    said.show("page")
    return result


def _names(text: str) -> list[str]:
    """User names typed one per line or separated by commas or spaces."""
    return [n.strip().lower() for n in text.replace(",", " ").split() if n.strip()]


def _show_codes(codes: object, class_name: str) -> None:
    """Invite codes made just now: kept for this session so they can be downloaded (the hub keeps only hashes)."""
    if isinstance(codes, dict) and codes:
        st.session_state[f"codes-{class_name}"] = dict(codes)


if identity.admin:
    with st.expander("Add a class"), st.form("add-class"):
        name = st.text_input("Class name", placeholder="ml102")
        left, right = st.columns(2)
        max_slice = left.text_input("Largest slice per student", "4 GiB")
        budget = right.text_input("GPU budget for the whole class", "2 slices", help='"2 slices", or "8 GiB"')
        teachers = st.text_input("Teachers (user names)", placeholder="tina")
        students = st.text_area("Students (user names, one per line)")
        if st.form_submit_button("Add the class"):
            rules = {"max_slice": max_slice.replace(" ", ""), "budget": budget, "teachers": _names(teachers)}
            made = _act(
                lambda: classes.add_class(identity, name.strip().lower(), rules, _names(students)),
                f"Class {name} added. Nobody's server was stopped.",
            )
            _show_codes(made, name.strip().lower())

try:
    mine = classes.taught(identity)
except SourceUnavailableError as exc:
    st.error(f"{exc}. This page needs it; reload in a moment.")
    st.stop()
if not mine:
    st.info("You teach no class yet. An admin adds you as a class's teacher.")
    st.stop()

by_name = {c.name: c for c in mine}
chosen: ClassInfo = by_name[st.selectbox("Class", sorted(by_name)) or sorted(by_name)[0]]
quota = read_group(chosen.name, {k: v for k, v in chosen.rules.items() if k != "name"}).quota
members = chosen.members

# -- budget ----------------------------------------------------------------------------------
_, holds = servers.inventory(identity)
held = sum(h.memory_bytes for h in holds if h.group == chosen.name)
rules_words = []
if quota.max_slice_bytes:
    rules_words.append(f"slices up to {format_bytes(quota.max_slice_bytes)}")
if quota.servers_per_user is not None:
    rules_words.append(f"{quota.servers_per_user} server{'' if quota.servers_per_user == 1 else 's'} per student")
st.caption(
    f"{len(members)} students · teachers: {', '.join(chosen.teachers) or 'none'}"
    + (f" · {', '.join(rules_words)}" if rules_words else "")
)
if quota.budget_bytes:
    share = held / quota.budget_bytes
    written = str(chosen.rules.get("budget", ""))
    if "slice" in written:  # as the teacher wrote it: "2 slices of 4 GiB"
        slices = f" ({written})"
    else:
        slices = f" ({quota.budget_bytes // quota.max_slice_bytes} slices)" if quota.max_slice_bytes else ""
    text = f"GPU budget: {format_bytes(held)} of {format_bytes(quota.budget_bytes)}{slices} held now"
    st.progress(min(1.0, share), text=text)
else:
    st.caption(f"No GPU budget: the class holds {format_bytes(held)} now.")

if identity.admin:
    with st.expander("Change the class"):
        with st.form("change-class"):
            left, right = st.columns(2)
            new_slice = left.text_input("Largest slice", str(chosen.rules.get("max_slice", "")))
            new_budget = right.text_input("GPU budget", str(chosen.rules.get("budget", "")))
            new_teachers = st.text_input("Teachers", ", ".join(chosen.teachers))
            if st.form_submit_button("Save"):
                changed = {"teachers": _names(new_teachers)}
                if new_slice.strip():
                    changed["max_slice"] = new_slice.replace(" ", "")  # type: ignore[assignment]
                if new_budget.strip():
                    changed["budget"] = new_budget.strip()  # type: ignore[assignment]
                _act(
                    lambda: classes.change_class(identity, chosen.name, changed),
                    "Saved: new starts follow it; running servers keep going.",
                )
        sure = st.checkbox(f"Remove {chosen.name} (its students keep their accounts and servers)")
        if sure and st.button("Remove the class"):
            _act(lambda: classes.remove_class(identity, chosen.name), f"Removed {chosen.name}.")

# -- roster ----------------------------------------------------------------------------------
st.subheader("Students", divider="gray")
rows = {s.user: s for s in servers.servers(identity) if s.name == ""}
in_line = {w.user: w for w in line.waiting_line(identity) if w.server == ""}
now = time.time()


def _server_state(member: str) -> str:
    """What the student's server is doing, in words: a start that waits in line says so."""
    if member in in_line:
        return f"waiting for a GPU ({ordinal(in_line[member].position)} in line)"
    return rows[member].state if member in rows else "none"


st.dataframe(
    [
        {
            "student": m,
            "account": "joined" if m in chosen.joined else "invite waiting" if m in chosen.invited else "no invite",
            "server": _server_state(m),
            "GPU": views.slice_text(rows[m], None) if m in rows and rows[m].state != "stopped" else "",
            "last activity": views.ago_text(rows[m].last_activity, now) if m in rows else "",
        }
        for m in members
    ],
    hide_index=True,
    width="stretch",
)
with st.form("add-students", clear_on_submit=True):
    added = st.text_area("Add students (user names, one per line)")
    if st.form_submit_button("Add to the class") and _names(added):
        codes = _act(
            lambda: classes.add_members(identity, chosen.name, _names(added)),
            "Added. Nobody's server was stopped. Hand each new student their invite code below.",
        )
        _show_codes(codes, chosen.name)
picked = st.multiselect("Students", members, key=f"picked-{chosen.name}")
left, right = st.columns(2)
if left.button("New invite codes", disabled=not picked, help="The old codes stop working; joined students keep theirs"):
    codes = _act(
        lambda: classes.invite_again(identity, chosen.name, picked), "New codes made (students who joined get none)."
    )
    _show_codes(codes, chosen.name)
if right.button("Remove from the class", disabled=not picked):
    _act(
        lambda: classes.remove_members(identity, chosen.name, picked),
        "Removed. Their servers keep running; they lose the class's GPU rules at their next start.",
    )
codes_made = st.session_state.get(f"codes-{chosen.name}") or {}
if codes_made:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["username", "invite_code"])
    writer.writerows(sorted(codes_made.items()))
    st.markdown(
        "Invite codes made now (each works once, at **/hub/join**; they are not shown again):\n"
        + "\n".join(f"- **{views.plain(user)}**: `{code}`" for user, code in sorted(codes_made.items()))
    )
    st.download_button("Download the invite codes", out.getvalue(), f"{chosen.name}-invites.csv", "text/csv")


# -- servers and the line --------------------------------------------------------------------
@st.fragment(run_every=clients.REFRESH_S)
def live_class() -> None:
    """The class's servers and its places in the GPU line, live like the Servers page."""
    st.subheader("Servers", divider="gray")
    try:
        running = [s for s in servers.servers(identity) if s.user in members and s.state in ("running", "starting")]
        waiting = [w for w in line.waiting_line(identity) if w.user in members]
    except SourceUnavailableError as exc:
        st.error(f"{exc}. Reload in a moment.")
        return
    now = time.time()
    if running:
        st.dataframe(
            [
                {
                    "student": s.user,
                    "server": s.name or "(default)",
                    "state": s.state,
                    "GPU": views.slice_text(s, None),
                    "last activity": views.ago_text(s.last_activity, now),
                }
                for s in running
            ],
            hide_index=True,
            width="stretch",
        )
        stop = st.selectbox("Server", running, format_func=lambda s: f"{s.user}/{s.name or '(default)'}", key="stop")
        server = (stop.user, stop.name) if stop is not None else None
        stop_seen = said.seen("class-stop", server)
        if st.button("Stop this server") and stop is not None and said.may_act("class", "stop", server, stop_seen):
            said.act(
                "class", lambda: servers.stop_server(identity, stop.user, stop.name), f"Stopping {stop.user}'s server."
            )
    else:
        st.caption("No student of this class has a server running.")
    if waiting:
        st.markdown("**Waiting for a GPU**")
        st.dataframe(
            [
                {
                    "place": ordinal(w.position),
                    "student": w.user,
                    "asked for": w.asked,
                    "waiting for": views.duration_text(now - w.since),
                    "expected start": views.when_text(w.estimated_start, now, where)
                    if w.estimated_start
                    else "not known",
                }
                for w in waiting
            ],
            hide_index=True,
            width="stretch",
        )
        first = st.selectbox("Waiting student", waiting, format_func=lambda w: w.user, key="first")
        request = (first.user, first.server) if first is not None else None
        first_seen = said.seen("class-first", request)
        if st.button("Put first") and first is not None and said.may_act("class", "first", request, first_seen):
            said.act("class", lambda: line.put_first(identity, first.user, first.server), f"{first.user} goes first.")
    else:
        st.caption("Nobody of this class waits for a GPU.")
    said.show("class")


live_class()


# -- KAI's queue -----------------------------------------------------------------------------
@st.fragment(run_every=classes.QUEUE_S)
def kai_queue() -> None:
    """Under KAI Scheduler: the class's KAI queue, its quota and what KAI counts in it, and who waits there."""
    try:
        queue = classes.class_queue(identity, chosen.name)
    except PermissionError as exc:
        st.error(str(exc))
        return
    except SourceUnavailableError as exc:
        st.error(f"{exc}. Reload in a moment.")
        return
    if queue is None:
        return  # KAI does not queue this platform's pods: the GPU line above is the only one
    st.subheader("KAI queue", divider="gray")
    if not queue.exists:
        st.warning(
            f"KAI has no queue named {views.plain(queue.name)}: KAI places none of this class's GPU servers until "
            "an admin creates it (the chart makes one per class with gpuSharing.kai.createQueues)."
        )
    else:
        st.caption(
            f"KAI Scheduler queues and places this class's GPU servers: queue **{views.plain(queue.name)}** under "
            f"**{views.plain(queue.parent or 'no parent')}**. Allocated and requested are KAI's counts for the queue."
        )
        st.markdown(" · ".join(f"{label}: **{value}**" for label, value in views.queue_figures(queue).items()))
    if queue.waiting:
        st.markdown("**Waiting for KAI**")
        st.dataframe(views.queued_rows(queue.waiting), hide_index=True, width="stretch")
    else:
        st.caption("No server of this class waits for KAI.")


kai_queue()

# -- reservations and usage -----------------------------------------------------------------
st.subheader("Reserved GPU memory", divider="gray")
booked = [r for r in line.reservations(identity) if r.group == chosen.name]
if booked:
    st.dataframe(
        views.reservation_rows(booked, now, where, with_class=False),
        hide_index=True,
        width="stretch",
    )
else:
    st.caption("Nothing is reserved for this class. Reserve GPU memory for a lesson on the Servers page.")

st.subheader("Usage", divider="gray")
try:
    usage = [r for r in metrics.usage_rows(identity, 4) if r.user in members]
except MetricsUnavailableError as exc:
    st.caption(f"Usage needs the platform's metrics, which are unavailable: {exc}.")
else:
    if usage:
        week = max(r.week for r in usage)
        st.dataframe(
            [
                {
                    "student": r.user,
                    "GPU-hours held": round(r.allocated_h, 1),
                    "used": round(r.used_h, 1),
                    "held idle": round(r.allocated_h - r.used_h, 1),
                }
                for r in usage
                if r.week == week
            ],
            hide_index=True,
            width="stretch",
        )
        st.caption(f"Week {week}. A GPU-hour is one whole card for an hour.")
    else:
        st.caption("No GPU use by this class in the last four weeks.")
