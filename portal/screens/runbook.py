from pathlib import Path

import streamlit as st

from portal import views

st.title("Runbook")
source = Path(__file__).parents[2] / views.RUNBOOK_DOC
if source.exists():
    # Our own document (not user text): its headings become the anchors the alerts link to.
    st.markdown(source.read_text().split("\n", 1)[1])
else:
    st.info(f"The runbook is {views.RUNBOOK_DOC} in gpuslice's source; this installation does not include it.")
