import streamlit as st

from portal import charts, sources
from portal.data.prometheus import MetricsUnavailableError
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Overview")
inventory, holds = sources.inventory()
servers = sources.servers(identity)
gpus = list(inventory.gpus())
simulated = any(g.simulated for g in gpus)

if simulated:
    st.caption("The GPUs of this machine are simulated: there is no NVIDIA GPU.")
cols = st.columns(5)
cols[0].metric("GPUs", len(gpus), help="Simulated" if simulated else None)
cols[1].metric(
    "Allocated", format_bytes(inventory.allocated_bytes), help=f"of {format_bytes(inventory.capacity_bytes)}"
)
cols[2].metric("Capacity", format_bytes(inventory.capacity_bytes))
cols[3].metric("Running servers", sum(s.state == "running" for s in servers))
cols[4].metric("Starting", sum(s.state == "starting" for s in servers))

hours = st.segmented_control("Time range", [1, 6, 24], default=1, format_func=lambda h: f"{h} h") or 1
try:
    totals = sources.summary()
    used = totals.get("gpuslice:gpu_memory_used_bytes:sum")
    util = totals.get("gpuslice:gpu_utilization:avg")
    alerts = sources.active_alerts()
    live = st.columns(3)
    live[0].metric("GPU memory in use", format_bytes(used) if used is not None else "n/a")
    live[1].metric("Mean GPU utilization", f"{util:.0f}%" if util is not None else "n/a")
    live[2].metric("Alerts firing", sum(a.state == "active" for a in alerts))
    series = {
        "allocated": sources.trend("gpuslice:gpu_memory_allocated_bytes:sum / 2^30", hours),
        "in use": sources.trend("gpuslice:gpu_memory_used_bytes:sum / 2^30", hours),
    }
    if any(len(points) > 1 for points in series.values()):
        st.plotly_chart(charts.trend(series, "GiB"), width="stretch")
    else:
        st.caption("No history yet: the trend appears after a few scrapes.")
except MetricsUnavailableError as exc:
    st.warning(f"Metrics are unavailable right now: {exc}. Allocations and servers above are current.")
