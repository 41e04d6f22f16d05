import streamlit as st

from portal import charts, views
from portal.data.errors import SourceUnavailableError
from portal.data.prometheus import MetricsUnavailableError
from portal.sources import alerts, clients, line, metrics, servers
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Overview")


@st.fragment(run_every=clients.REFRESH_S)
def live_counts() -> None:
    """Servers and allocations follow the hub and the ledger without reloading the page."""
    try:
        inventory, holds = servers.inventory(identity)
        mine_servers = [s for s in servers.servers(identity) if s.user == identity.name]
        counts = servers.server_counts()
    except SourceUnavailableError as exc:  # inside a fragment the app's handler does not see it
        st.error(f"{exc}. This page needs it; reload in a moment.")
        return
    gpus = list(inventory.gpus())
    simulated = any(g.simulated for g in gpus)

    st.subheader("You", divider="gray")
    mine = st.columns(3)
    mine[0].metric("Your servers running", sum(s.state == "running" for s in mine_servers))
    mine[1].metric("Your servers starting", sum(s.state == "starting" for s in mine_servers))
    mine[2].metric("Your GPU memory held", format_bytes(sum(h.memory_bytes for h in holds if h.user == identity.name)))

    st.subheader("Cluster", divider="gray")
    if simulated:
        st.caption("The GPUs of this machine are simulated: there is no NVIDIA GPU.")
    cols = st.columns(4)
    cols[0].metric("GPUs", len(gpus), help="Simulated" if simulated else None)
    cols[1].metric("GPU memory allocated", format_bytes(inventory.allocated_bytes))
    cols[2].metric("GPU memory capacity", format_bytes(inventory.capacity_bytes))
    cols[3].metric("Nodes healthy", f"{sum(n.healthy for n in inventory.nodes)} of {len(inventory.nodes)}")
    more = st.columns(4)
    more[0].metric("Servers running", counts["running"])
    more[1].metric("Servers starting", counts["starting"])
    more[2].metric("Users with a server", counts["users"])


live_counts()

hours = st.segmented_control("Time range", [1, 6, 24], default=1, format_func=lambda h: f"{h} h") or 1
try:
    used = views.memory_in_use(metrics.gpu_readings())  # the GPUs page's readings: the same figure
    totals = metrics.summary()
    util = totals.get("gpuslice:gpu_utilization:avg")
    health = st.columns(4)
    health[3].metric("GPU memory in use", format_bytes(used) if used is not None else "n/a")
    health[0].metric("Mean GPU utilization", f"{util:.0f}%" if util is not None else "n/a")
    if identity.admin:  # the platform's health is for those who act on it: no incidents on a student's page
        firing = alerts.active_alerts(identity)
        success = metrics.spawn_success()
        health[1].metric("Alerts firing", sum(a.state == "active" for a in firing))
        health[2].metric("Spawns that started (1 h)", "no attempts" if success is None else f"{success:.0%}")
    series = {
        "allocated": metrics.trend("gpuslice:gpu_memory_allocated_bytes:sum / 2^30", hours),
        "in use": metrics.trend("gpuslice:gpu_memory_used_bytes:sum / 2^30", hours),
    }
    utilization = {"mean utilization": metrics.trend("gpuslice:gpu_utilization:avg", hours)}
    if any(len(points) > 1 for points in series.values()):
        left, right = st.columns(2)
        left.plotly_chart(charts.trend(series, "GiB", "Cluster GPU memory (GiB)"), width="stretch")
        right.plotly_chart(charts.trend(utilization, "%", "Cluster mean GPU utilization (%)"), width="stretch")
    else:
        st.caption("No history yet: the charts fill in after a few minutes.")
except MetricsUnavailableError as exc:
    # Why, for those who can fix it; for everyone else, what it means for them.
    why = f": {exc}" if identity.admin else ""
    st.warning(f"GPU readings are not available right now{why}. Your servers and slices above are current.")

st.subheader("Waiting for a GPU", divider="gray")
st.caption(views.wait_scope_text(line.line_manager(identity), line.WAIT_DAYS))
waits = views.wait_rows(line.wait_times(identity))
if waits:
    st.dataframe(waits, hide_index=True, width="stretch")
else:
    st.caption("Nobody waited in line in these days.")
