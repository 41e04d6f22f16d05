"""What the per-card anomaly models found (admins), each with its evidence: the words and the series."""

import streamlit as st

from portal import views
from portal.data.prometheus import MetricsUnavailableError
from portal.sources import metrics

identity = st.session_state["identity"]
st.title("Anomalies")
if not identity.admin:
    st.error("Anomalies are for admins.")
    st.stop()
st.caption(
    "Per-card models (docs/operations.md) find what the alert thresholds miss: a card hotter than its load "
    "explains, GPU memory climbing steadily, correctable ECC errors coming faster and faster, a held card whose "
    "work collapsed. They learn each card from its first two of the last three days."
)
try:
    findings = metrics.anomalies(identity)
    start, history = metrics.card_history()
    platform = metrics.platform_load() if any(f.kind == "utilization collapsed" for _, f, _ in findings) else {}
except MetricsUnavailableError as exc:
    st.warning(f"Prometheus is unavailable: {exc}.")
    st.stop()
if not findings:
    st.success("Nothing unusual in the last three days.")
SHOWN = 180  # samples of context before the finding, and a few after
SERIES = {  # what each model looked at, charted around its finding
    "hot for its load": ("temperature", "utilization"),
    "memory growing": ("memory",),
    "correctable errors rising": ("errors",),
    "utilization collapsed": ("utilization", "platform"),
}
LABELS = {"memory": "memory GiB", "errors": "correctable errors (total)", "platform": "other held cards' mean %"}
for (node, gpu), finding, when in findings[:20]:
    with st.container(border=True):
        st.markdown(f"**{finding.kind}** on {views.plain(node)} GPU {views.plain(gpu)}, {when:%a %d %b %H:%M} UTC")
        st.caption(finding.evidence)
        first, last = max(0, finding.found - SHOWN), finding.found + 30
        series = {**history, "platform": platform}
        chart = {LABELS.get(n, n): (series[n].get((node, gpu)) or [])[first:last] for n in SERIES[finding.kind]}
        if "memory GiB" in chart:
            chart["memory GiB"] = [v / 2**30 if v is not None else None for v in chart["memory GiB"]]
        chart["minute"] = list(range(first - finding.found, first - finding.found + len(next(iter(chart.values())))))
        st.line_chart(chart, x="minute", y=[k for k in chart if k != "minute"])
