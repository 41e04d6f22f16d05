import streamlit as st

from portal import charts, views
from portal.data.prometheus import GpuReading, MetricsUnavailableError
from portal.sources import metrics, servers
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("GPUs")
inventory, _ = servers.inventory(identity)
readings: dict[tuple[str, str], GpuReading] | None
try:
    readings = metrics.gpu_readings()
except MetricsUnavailableError as exc:
    st.warning(f"Live readings are unavailable: {exc}. Showing allocations only.")
    readings = None
rows = views.gpu_rows(inventory, readings)
if any(r.simulated for r in rows):
    st.info("These GPUs are simulated: there is no NVIDIA GPU on this machine.")
st.plotly_chart(charts.allocation_bars(rows), width="stretch")
if readings is not None:
    hours = st.segmented_control("Utilization over", [1, 6, 24], default=1, format_func=lambda h: f"{h} h") or 1
    try:
        series = metrics.utilization_heatmap(hours, per_node=len(rows) > 64)
    except MetricsUnavailableError as exc:
        st.warning(f"History is unavailable: {exc}.")
    else:
        if series:
            st.plotly_chart(charts.heatmap(series, "%"), width="stretch")


def number(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


st.dataframe(
    [
        {
            "node": r.node,
            "GPU": r.gpu,
            "model": r.model + (" (simulated)" if r.simulated else ""),
            "capacity": format_bytes(r.capacity_bytes),
            "allocated": format_bytes(r.allocated_bytes),
            "slices": r.holders,  # who holds it: before the readings, visible without scrolling sideways
            "used": "n/a" if r.used_bytes is None else format_bytes(r.used_bytes),
            "utilization": number(r.utilization_pct, "{:.0f}%"),
            "temperature": number(r.temperature_c, "{:.0f} C"),
            "power": number(r.power_w, "{:.0f} W"),
            "last Xid": number(r.last_xid, "{}"),
        }
        for r in rows
    ],
    hide_index=True,
    width="stretch",
)
