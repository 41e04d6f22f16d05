import shlex

import streamlit as st

from portal.data.errors import SourceUnavailableError
from portal.sources import jobs, markets

identity = st.session_state["identity"]
st.title("New job")
st.caption(
    "A command or a notebook of your home folder, run headless on a GPU slice while you do something else."
    " It waits in the same GPU line as the servers and runs as you, with your class's rules."
)
store = markets.market()
images = [i.slug for i in store.images(include_deprecated=False)]
models = [m.slug for m in store.models(["approved"])]

with st.form("new-job"):
    name = st.text_input("Name", placeholder="train-resnet")
    kind = st.radio("Run", ["A command", "A notebook"], horizontal=True)
    command = st.text_input("Command (run in your home folder)", placeholder="python train.py --epochs 3")
    notebook = st.text_input("Notebook (its path in your home folder)", placeholder="work/train.ipynb")
    left, right = st.columns(2)
    image = left.selectbox("Image", images, index=images.index("default") if "default" in images else 0)
    gpu = right.text_input("GPU", "4GiB", help='A slice as for a server: "4GiB", "0.25" of a card, "0" for CPU only.')
    cpus = left.number_input("CPU cores (0: your class's share)", min_value=0.0, max_value=256.0, value=0.0, step=0.5)
    memory = right.text_input("Memory (empty: your class's limit)", placeholder="8GiB")
    chosen_models = st.multiselect("Models (mounted read-only in ~/models)", models)
    env_text = st.text_area("Environment (one NAME=VALUE a line)", placeholder="SEED=1")
    left, middle, right = st.columns(3)
    time_limit = left.text_input("Time limit", "1h", help="2h, 90min or 3600 (seconds)")
    retries = middle.number_input("Retries", min_value=0, max_value=10, value=0)
    backfill = right.checkbox(
        "Backfill",
        help="Run only on slices nobody waits for; stopped (with time to checkpoint) when a person needs it.",
    )
    submitted = st.form_submit_button("Submit", type="primary")

if submitted:
    spec: dict[str, object] = {
        "name": name,
        "image": image,
        "gpu_memory": gpu.strip() or "0",
        "models": chosen_models,
        "time_limit": time_limit.strip(),
        "retries": int(retries),
        "priority": "backfill" if backfill else "normal",
    }
    try:
        if kind == "A command":
            spec["command"] = shlex.split(command)
        else:
            spec["notebook"] = notebook.strip()
        spec["env"] = dict(line.split("=", 1) for line in env_text.splitlines() if line.strip())
    except ValueError as exc:  # an unclosed quote; an environment line without "="
        st.error(f"Not submitted: write the command as in a shell and each variable as NAME=VALUE ({exc}).")
        st.stop()
    if cpus:
        spec["cpus"] = cpus
    if memory.strip():
        spec["memory"] = memory.strip()
    try:
        job = jobs.submit(identity, spec)
    except (PermissionError, ValueError, LookupError) as exc:
        st.error(f"Not submitted: {exc}")  # the hub's words: what to ask instead
    except SourceUnavailableError as exc:
        st.error(f"{exc}. Nothing was submitted; try again in a moment.")
    else:
        st.success(f"Submitted as job {job.id}: {job.state}. Follow it on the Jobs page.")
