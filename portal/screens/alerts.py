import streamlit as st

from portal import views
from portal.data.prometheus import MetricsUnavailableError
from portal.sources import alerts

identity = st.session_state["identity"]
st.title("Alerts")
if not identity.admin:  # the page is not listed for others; this stops a direct visit too
    st.error("Alerts are about the platform and go to its admins.")
    st.stop()
try:
    firing = alerts.active_alerts(identity)
except MetricsUnavailableError as exc:
    st.warning(f"Alertmanager is unavailable: {exc}.")
    st.stop()
if not firing:
    st.success("No alerts are firing.")
icons = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}
for alert in firing:
    with st.container(border=True):
        st.markdown(f"{icons.get(alert.severity, '')} **{alert.name}** ({alert.severity}): {alert.summary}")
        st.caption(views.plain(alert.description))
        href = views.runbook_href(alert.runbook)
        if href:
            st.markdown(f"[What to do: the runbook for {views.plain(alert.name)}]({href})")
        elif alert.runbook:
            st.caption(f"Runbook: {views.plain(alert.runbook)}")
