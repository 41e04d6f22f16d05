"""What the per-card anomaly models found (admins), each with its evidence: the words and the series."""

import streamlit as st

from portal import sources, views
from portal.data.prometheus import MetricsUnavailableError

identity = st.session_state["identity"]
st.title("Anomalies")
if not identity.admin:
    st.error("Anomalies are for admins.")
    st.stop()
st.caption(
    "Per-card models (docs/operations.md) find what the alert thresholds miss: a card hotter than its load "
    "explains, GPU memory climbing steadily. They learn each card from its first two of the last three days."
)
try:
    findings = sources.anomalies(identity)
    start, history = sources.card_history()
except MetricsUnavailableError as exc:
    st.warning(f"Prometheus is unavailable: {exc}.")
    st.stop()
if not findings:
    st.success("Nothing unusual in the last three days.")
SHOWN = 180  # samples of context before the finding, and a few after
for (node, gpu), finding, when in findings[:20]:
    with st.container(border=True):
        st.markdown(f"**{finding.kind}** on {views.plain(node)} GPU {views.plain(gpu)}, {when:%a %d %b %H:%M} UTC")
        st.caption(finding.evidence)
        first, last = max(0, finding.found - SHOWN), finding.found + 30
        names = ("temperature", "utilization") if finding.kind == "hot for its load" else ("memory",)
        chart = {name: (history[name].get((node, gpu)) or [])[first:last] for name in names}
        if "memory" in chart:
            chart = {"memory GiB": [v / 2**30 if v is not None else None for v in chart["memory"]]}
        chart["minute"] = list(range(first - finding.found, first - finding.found + len(next(iter(chart.values())))))
        st.line_chart(chart, x="minute", y=[k for k in chart if k != "minute"])
