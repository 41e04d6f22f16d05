import streamlit as st

from portal import sources, views
from portal.data import hub

identity = st.session_state["identity"]
st.title("Jobs")
servers = sources.servers(identity)
left, right = st.columns([2, 1])
search = left.text_input("Search user or image")
states = set(right.multiselect("State", ["running", "starting", "stopping", "stopped"]))
shown = [s for s in servers if views.server_matches(s, states, search)]
_, holds = sources.inventory()
held = {h.key: h for h in holds}
st.dataframe(
    [
        {
            "user": s.user,
            "server": s.name or "(default)",
            "state": s.state,
            "slice": views.slice_text(s, held.get(f"{s.user}/{s.name}")),
            "image": s.image,
            "started": s.started,
            "last activity": s.last_activity,
        }
        for s in shown
    ],
    hide_index=True,
    width="stretch",
)
running = [s for s in shown if s.state in ("running", "starting") and (identity.admin or s.user == identity.name)]
if running:
    choice = st.selectbox("Stop a server", running, format_func=lambda s: f"{s.user}/{s.name or '(default)'}")
    if st.button("Stop", type="primary") and choice is not None:
        try:
            hub.stop_server(sources.hub_client(), identity, choice.user, choice.name)
        except PermissionError as exc:
            st.error(str(exc))
        else:
            sources.servers.clear()
            st.success(f"Stopping {choice.user}/{choice.name or '(default)'}.")
