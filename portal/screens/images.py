import sys
from dataclasses import replace

import streamlit as st

from market.catalog import FRAMEWORKS, ImageEntry
from market.store import Image, MarketError
from portal import views
from portal.data import markets
from portal.sources import classes, clients, servers
from portal.sources import markets as market_data
from spawner.shares import format_bytes

identity = st.session_state["identity"]
st.title("Image market")
st.caption("Curated notebook environments. Launch one to start your server with it.")
if "published" in st.session_state:
    st.success(st.session_state.pop("published"))
try:
    store = market_data.market()
    cards = markets.image_cards(
        store, identity, classes.my_groups(identity), servers.image_usage(), platform_prefix=sys.prefix
    )
except MarketError as exc:
    st.error(f"The market is unavailable: {exc}")
    st.stop()

mine = [s for s in servers.servers(identity) if s.user == identity.name and s.name == ""]
busy = next((s for s in mine if s.state in ("running", "starting", "stopping")), None)
if busy is not None:
    st.info(f"Your server is {busy.state} with image {busy.image}. Stop it on the Servers page to launch another.")

inventory, _ = servers.inventory(identity)
largest_card = max((g.memory_bytes for g in inventory.gpus()), default=0)
gpu_values, gpu_default = markets.launch_choices(classes.group_rules(), classes.my_groups(identity), largest_card)
gpu_choice = st.selectbox(
    "GPU for the server you launch",
    gpu_values,
    index=gpu_values.index(gpu_default),
    format_func=markets.gpu_label,
    help="What your groups allow. The hub checks it again when the server starts.",
)

search_col, fw_col, cuda_col, tag_col = st.columns([2, 1, 1, 1])
search = search_col.text_input("Search", placeholder="name, package, tag")
frameworks = set(fw_col.multiselect("Framework", FRAMEWORKS))
cudas = set(cuda_col.multiselect("CUDA", sorted({c.image.cuda or "none" for c in cards})))
tags = set(tag_col.multiselect("Tags", sorted({t for c in cards for t in c.image.tags})))
largest = max((c.image.size_bytes for c in cards), default=0) / 2**30
ceiling = float(max(1, round(largest + 0.5)))
max_gib = st.slider("Largest download (GiB)", 0.0, ceiling, ceiling)
shown = [c for c in cards if views.image_matches(c.image, search, frameworks, cudas, tags, max_gib)]
if not shown:
    st.info("No image matches these filters.")

for card in shown:
    image = card.image
    with st.container(border=True):
        head, action = st.columns([4, 1])
        head.markdown(f"**{views.plain(image.name)}** · `{image.slug}` · version {views.plain(image.version)}")
        facts = [image.framework, f"CUDA {image.cuda}" if image.cuda else "no CUDA", format_bytes(image.size_bytes)]
        facts.append(f"{card.running} server(s) running it")
        head.caption(" · ".join(views.plain(f) for f in facts))
        if image.description:
            head.markdown(views.described(image.description))
        if image.contents:
            head.caption("Contains: " + ", ".join(views.plain(c) for c in image.contents))
        if image.tags:
            head.caption("Tags: " + ", ".join(views.plain(t) for t in image.tags))
        if card.blocker:
            action.caption(card.blocker.capitalize())
        elif action.button("Launch", key=f"launch-{image.slug}", type="primary", disabled=busy is not None):
            try:
                started = markets.launch(
                    clients.acting_client(identity), store, identity, image.slug, gpu_memory=gpu_choice
                )
                action.success(started)
                action.markdown(f"[Open your server]({markets.server_url(identity)})")
                servers.forget_servers()
            except markets.MarketRefusedError as exc:
                action.error(str(exc))
        if identity.admin:
            status = "active" if image.status == "deprecated" else "deprecated"
            label = "Restore" if image.status == "deprecated" else "Deprecate"
            if action.button(label, key=f"status-{image.slug}"):
                markets.set_image_status(store, identity, image.slug, status)
                st.rerun()

if identity.admin:
    with st.expander("Publish or edit an image (admins)"), st.form("publish", clear_on_submit=False):
        left, right = st.columns(2)
        slug = left.text_input("Id", help="lower-case letters, digits and '-'; an existing id is edited")
        name = right.text_input("Name")
        version = left.text_input("Version")
        # No default: editing an image must not silently change its framework to the first choice.
        framework = right.selectbox("Framework", FRAMEWORKS, index=None, placeholder="Choose a framework")
        cuda = left.text_input("CUDA version", placeholder="12.4 (empty: none)")
        size = right.text_input("Size", value="1GiB")
        local = left.text_input("Local environment", placeholder="/opt/envs/name or @platform")
        container = right.text_input("Container image", placeholder="ghcr.io/org/image:tag")
        tags_text = left.text_input("Tags (comma-separated)")
        groups_text = right.text_input("Only for groups (comma-separated; empty: everyone)")
        contents_text = st.text_input("Contains (comma-separated)")
        description = st.text_area("Description")
        if st.form_submit_button("Publish"):
            entry, errors = views.validated(
                ImageEntry,
                {
                    "id": slug,
                    "name": name,
                    "version": version,
                    "framework": framework,
                    "cuda": cuda or None,
                    "size": size,
                    "local": local or None,
                    "container": container or None,
                    "tags": views.split_list(tags_text),
                    "groups": views.split_list(groups_text),
                    "contents": views.split_list(contents_text),
                    "description": description,
                },
            )
            for error in errors:
                st.error(error)
            if entry is not None:
                image = replace(Image.from_entry(entry), origin="admin")
                outcome = markets.publish_image(store, identity, image)
                st.session_state["published"] = f"Image {entry.id} {outcome}."
                st.rerun()  # the new card shows now, not after a reload
