import time

import streamlit as st

from portal import views
from portal.sources import classes, servers
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Classes")
rules = {g.name: g.quota for g in classes.group_rules()}
groups = classes.visible_groups(identity)
_, holds = servers.inventory(identity)
rows = views.class_rows(groups, rules, holds, servers.servers(identity), idle_after_s=1800, now_ts=time.time())
if not rows:
    if identity.admin:
        st.info("No classes yet: add one on the Teaching page, or with `gpuslice class add NAME roster.csv`.")
    else:
        st.info("You are in no class.")
for row in rows:
    with st.container(border=True):
        st.subheader(row.name)
        cols = st.columns(4)
        cols[0].metric("Members", row.members)
        cols[1].metric("Servers running", row.running)
        # The budget goes under the cards, in full: "8 GiB of 80 GiB" does not fit a quarter-width card.
        cols[2].metric("GPU memory held", format_bytes(row.allocated_bytes))
        cols[3].metric("Idle for 30 min", row.idle_servers)
        if row.budget_bytes:
            share = row.allocated_bytes / row.budget_bytes
            held = f"{format_bytes(row.allocated_bytes)} of the {format_bytes(row.budget_bytes)} budget held"
            st.progress(min(1.0, share), text=f"{held} ({share:.0%})")
