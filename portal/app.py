"""The portal's entry point: identity check, then the pages (st.navigation)."""

import streamlit as st

from portal.auth import require_identity
from portal.data.errors import SourceUnavailableError
from portal.sources import classes

st.set_page_config(page_title="gpuslice", page_icon=":material/memory:", layout="wide")
identity = require_identity()
st.session_state["identity"] = identity

try:
    teaches = classes.teaches(identity)
except SourceUnavailableError:  # the hub is busy: the page is back at the next load
    teaches = identity.admin
pages = [
    st.Page("screens/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("screens/gpus.py", title="GPUs", icon=":material/memory:"),
    st.Page("screens/servers.py", title="Servers", icon=":material/dns:"),
    st.Page("screens/jobs.py", title="Jobs", icon=":material/list:"),
    st.Page("screens/new_job.py", title="New job", icon=":material/add_task:"),
    st.Page("screens/classes.py", title="Classes", icon=":material/school:"),
    *([st.Page("screens/teaching.py", title="Teaching", icon=":material/co_present:")] if teaches else []),
    st.Page("screens/usage.py", title="Usage", icon=":material/query_stats:"),
    *([st.Page("screens/alerts.py", title="Alerts", icon=":material/notifications:")] if identity.admin else []),
    *([st.Page("screens/incidents.py", title="Incidents", icon=":material/emergency:")] if identity.admin else []),
    *([st.Page("screens/anomalies.py", title="Anomalies", icon=":material/troubleshoot:")] if identity.admin else []),
    st.Page("screens/images.py", title="Images", icon=":material/inventory_2:"),
    st.Page("screens/models.py", title="Models", icon=":material/model_training:"),
    st.Page("screens/runbook.py", title="Runbook", icon=":material/menu_book:"),
]
st.sidebar.caption(f"Signed in as **{identity.name}**{' (admin)' if identity.admin else ''}")
try:
    st.navigation(pages).run()
except SourceUnavailableError as exc:  # a busy or restarting hub: say so, never a traceback
    st.error(f"{exc}. This page needs it; reload in a moment.")
