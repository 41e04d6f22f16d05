import streamlit as st

from portal import sources
from portal.data.prometheus import MetricsUnavailableError

st.title("Alerts")
try:
    alerts = sources.active_alerts()
except MetricsUnavailableError as exc:
    st.warning(f"Alertmanager is unavailable: {exc}.")
    st.stop()
if not alerts:
    st.success("No alerts are firing.")
icons = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}
for alert in alerts:
    with st.container(border=True):
        st.markdown(f"{icons.get(alert.severity, '')} **{alert.name}** ({alert.severity}): {alert.summary}")
        st.caption(alert.description)
        if alert.runbook:
            st.caption(f"Runbook: {alert.runbook}")
