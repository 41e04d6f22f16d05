"""GPU-hours allocated, used and held idle per user and week (spawner/usage.py), in the viewer's scope."""

import streamlit as st

from portal.data.prometheus import MetricsUnavailableError
from portal.sources import classes, metrics
from spawner import usage

identity = st.session_state["identity"]
st.title("GPU usage")
scope = classes.scope(identity)
whose = "everyone's" if scope.everyone else ("your classes'" if scope.teaches else "your")
st.caption(
    f"Showing {whose} GPU-hours. A GPU-hour is one whole card for an hour; *used* means the card was busy while "
    "the server had a process on it; *idle-held* is allocated minus used."
)
weeks = st.selectbox("Weeks", [1, 2, 4, 8], index=2)
try:
    rows = metrics.usage_rows(identity, weeks)
except MetricsUnavailableError as exc:
    st.warning(f"Usage is not available right now{f': {exc}' if identity.admin else ''}.")
    st.stop()
if not rows:
    st.info("No GPU slices were held in these weeks.")
    st.stop()
latest = max(r.week for r in rows)
this_week = [r for r in rows if r.week == latest]
cols = st.columns(3)
cols[0].metric(f"Allocated ({latest})", f"{sum(r.allocated_h for r in this_week):.1f} GPU-h")
cols[1].metric(f"Used ({latest})", f"{sum(r.used_h for r in this_week):.1f} GPU-h")
cols[2].metric(f"Idle-held ({latest})", f"{sum(r.idle_h for r in this_week):.1f} GPU-h")
weekly = usage.trend(rows)
st.subheader("Trend")
trend = {"week": [w for w, _, _ in weekly], "allocated": [a for _, a, _ in weekly], "used": [u for _, _, u in weekly]}
st.line_chart(trend, x="week", y=["allocated", "used"], y_label="GPU-hours")
if scope.everyone or scope.teaches:
    st.subheader(f"Most idle-held in {latest}")
    worst = usage.worst_holders(rows, latest, 10)
    st.dataframe(
        [{"user": r.user, "class": r.group, "idle GPU-h": round(r.idle_h, 2)} for r in worst],
        hide_index=True,
    )
st.subheader("Per user and week")
table = [
    {
        "week": r.week,
        "user": r.user,
        "class": r.group,
        "allocated GPU-h": r.allocated_h,
        "used GPU-h": r.used_h,
        "idle-held GPU-h": round(r.idle_h, 3),
    }
    for r in rows
]
st.dataframe(table, hide_index=True)
st.download_button("Download CSV", usage.to_csv(rows), file_name="gpu-usage.csv", mime="text/csv")
