import streamlit as st

from portal import charts, sources
from portal.data.prometheus import MetricsUnavailableError
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Overview")
inventory, holds = sources.inventory(identity)
servers = sources.servers(identity)
gpus = list(inventory.gpus())
simulated = any(g.simulated for g in gpus)

if simulated:
    st.caption("The GPUs of this machine are simulated: there is no NVIDIA GPU.")
healthy = sum(n.healthy for n in inventory.nodes)
cols = st.columns(5)
cols[0].metric("GPUs", len(gpus), help="Simulated" if simulated else None)
cols[1].metric(
    "Allocated", format_bytes(inventory.allocated_bytes), help=f"of {format_bytes(inventory.capacity_bytes)}"
)
cols[2].metric("Capacity", format_bytes(inventory.capacity_bytes))
cols[3].metric("Running servers", sum(s.state == "running" for s in servers))
cols[4].metric("Starting", sum(s.state == "starting" for s in servers))
more = st.columns(5)
more[0].metric("Nodes healthy", f"{healthy} of {len(inventory.nodes)}")
more[1].metric("Active users", len({s.user for s in servers if s.state in ("running", "starting")}))

hours = st.segmented_control("Time range", [1, 6, 24], default=1, format_func=lambda h: f"{h} h") or 1
try:
    totals = sources.summary()
    used = totals.get("gpuslice:gpu_memory_used_bytes:sum")
    util = totals.get("gpuslice:gpu_utilization:avg")
    alerts = sources.active_alerts()
    success = sources.spawn_success()
    more[2].metric("GPU memory in use", format_bytes(used) if used is not None else "n/a")
    more[3].metric("Mean GPU utilization", f"{util:.0f}%" if util is not None else "n/a")
    more[4].metric("Alerts firing", sum(a.state == "active" for a in alerts))
    st.metric("Spawns that started (1 h)", "no attempts" if success is None else f"{success:.0%}")
    series = {
        "allocated": sources.trend("gpuslice:gpu_memory_allocated_bytes:sum / 2^30", hours),
        "in use": sources.trend("gpuslice:gpu_memory_used_bytes:sum / 2^30", hours),
    }
    utilization = {"mean utilization": sources.trend("gpuslice:gpu_utilization:avg", hours)}
    if any(len(points) > 1 for points in series.values()):
        left, right = st.columns(2)
        left.plotly_chart(charts.trend(series, "GiB"), width="stretch")
        right.plotly_chart(charts.trend(utilization, "%"), width="stretch")
    else:
        st.caption("No history yet: the trends appear after a few scrapes.")
except MetricsUnavailableError as exc:
    st.warning(f"Metrics are unavailable right now: {exc}. Allocations and servers above are current.")
