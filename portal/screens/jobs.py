import time

import streamlit as st

from portal import sources, views
from portal.data.errors import SourceUnavailableError

identity = st.session_state["identity"]
st.title("Jobs")
left, right = st.columns([2, 1])
search = left.text_input("Search user or image")
states = set(right.multiselect("State", views.JOB_STATES))


def _label(job: views.JobRow) -> str:
    return f"{job.user}/{job.server or '(default)'}"


@st.fragment(run_every=sources.REFRESH_S)
def live_table() -> list[views.JobRow]:
    """The table and the reasons, re-read twice a second without reloading the page."""
    now = time.time()
    try:
        jobs = views.job_rows(
            sources.servers(identity), sources.inventory(identity)[1], sources.server_events(identity), now_ts=now
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
            history = sources.server_history(identity, chosen.user, chosen.server)
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
        try:
            sources.stop_server(identity, choice.user, choice.server)
        except PermissionError as exc:
            st.error(str(exc))
        else:
            st.success(f"Stopping {_label(choice)}.")

st.subheader("Queue")
waiting = sources.waiting_line(identity)
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
                "note": "spawn lost (hub restarted?): keeps its place, starts when asked again" if w.away else "",
            }
            for w in waiting
        ],
        hide_index=True,
        width="stretch",
    )
