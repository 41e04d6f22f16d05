import streamlit as st

from market.catalog import ModelEntry
from market.store import MarketError, Model
from portal import views
from portal.data import markets
from portal.sources import markets as market_data
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Model market")
st.caption("Models you can mount read-only into your next notebook server, at ~/models/<id>.")
try:
    store = market_data.market()
    models = markets.visible_models(store, identity)
    chosen = set(store.selected_models(identity.name))
except MarketError as exc:
    st.error(f"The market is unavailable: {exc}")
    st.stop()

search_col, task_col, status_col = st.columns([2, 1, 1])
search = search_col.text_input("Search", placeholder="name, task, framework")
tasks = set(task_col.multiselect("Task", sorted({m.task for m in models})))
statuses = set(status_col.multiselect("Status", ["approved", "pending", "rejected"]))
shown = [m for m in models if views.model_matches(m, search, tasks, statuses)]
if not shown:
    st.info("No model matches these filters.")

for model in shown:
    with st.container(border=True):
        head, action = st.columns([4, 1])
        head.markdown(f"**{views.plain(model.name)}** · `{model.slug}` · version {views.plain(model.version)}")
        facts = [model.task, model.framework, model.license, format_bytes(model.size_bytes)]
        head.caption(" · ".join(views.plain(f) for f in facts))
        if model.description:
            head.markdown(views.described(model.description))
        if model.status != "approved":
            review = views.review_text(model.status, model.proposed_by, model.reviewed_by, model.review_note or "")
            head.warning(views.plain(review))
        if model.checksum:
            head.caption(f"Checksum {model.checksum}")
        if model.status == "approved":
            use = action.toggle("Use in notebook", value=model.slug in chosen, key=f"use-{model.slug}")
            if use != (model.slug in chosen):
                markets.use_model(store, identity, model.slug, use)
                chosen ^= {model.slug}
            if model.slug in chosen:
                head.caption(f"Mounted read-only at ~/models/{model.slug} in your next server. Load it with:")
                head.code(views.load_code(model), language="python")
        elif identity.admin and model.status == "pending":
            note = action.text_input("Note", key=f"note-{model.slug}")
            if action.button("Approve", key=f"approve-{model.slug}", type="primary"):
                markets.review_model(store, identity, model.slug, True, note)
                st.rerun()
            if action.button("Reject", key=f"reject-{model.slug}"):
                markets.review_model(store, identity, model.slug, False, note)
                st.rerun()

with st.expander("Propose a model"):
    root = market_data.models_root()
    st.caption(f"Copy its files into a folder under {root} first; an admin reviews each proposal.")
    with st.form("propose"):
        left, right = st.columns(2)
        slug = left.text_input("Id", help="lower-case letters, digits and '-'")
        name = right.text_input("Name")
        version = left.text_input("Version")
        task = right.text_input("Task", placeholder="text classification")
        framework = left.text_input("Framework", placeholder="pytorch")
        license_ = right.text_input("License", placeholder="Apache-2.0")
        path = st.text_input("Folder under the models root")
        description = st.text_area("Description")
        load = st.text_area("Code that loads it ({path} is the mounted folder)")
        if st.form_submit_button("Propose"):
            entry, errors = views.validated(
                ModelEntry,
                {
                    "id": slug,
                    "name": name,
                    "version": version,
                    "task": task,
                    "framework": framework,
                    "license": license_,
                    "path": path,
                    "description": description,
                    "load": load,
                },
            )
            for error in errors:
                st.error(error)
            if entry is not None and entry.path is not None:
                proposal = Model.from_entry(entry, entry.path, None, 0)
                try:
                    saved = markets.propose_model(store, identity, proposal, root, market_data.proposals_per_hour())
                except markets.MarketRefusedError as exc:
                    st.error(str(exc))
                else:
                    st.success(f"Proposed {saved.slug}; an admin will review it.")
