import time

import streamlit as st

from portal import job_views, said, views
from portal.data.errors import SourceUnavailableError
from portal.data.jobs import JobEvent, JobInfo
from portal.sources import clients, jobs
from spawner.words import counted

identity = st.session_state["identity"]
where = views.zone(st.context.timezone)  # the reader's own clock
st.title("Jobs")
st.caption(
    "Batch jobs: a command or a notebook run headless on a GPU slice, in the same line as the servers."
    " Submit one on New job, with `gpuslice job submit`, or from JupyterLab."
)
left, right = st.columns([2, 1])
search = left.text_input("Search user, name or image")
states = set(right.multiselect("State", job_views.JOB_STATES))


def _label(job: JobInfo) -> str:
    # No state here: the choices are read once per page run, the state below follows the hub.
    return f"{job.id}: {job.name} ({job.user})"


@st.fragment(run_every=clients.REFRESH_S)
def live_table() -> list[JobInfo]:
    """The jobs the hub lets the reader see, re-read without reloading the page."""
    now = time.time()
    try:
        found = jobs.jobs(identity)
    except SourceUnavailableError as exc:  # inside a fragment the app's handler does not see it
        st.error(f"{exc}. This page needs it; reload in a moment.")
        return []
    shown = [j for j in found if job_views.job_matches(j, states, search)]
    counts = {state: sum(j.state == state for j in found) for state in job_views.JOB_STATES}
    st.caption(" · ".join(f"{n} {state}" for state, n in counts.items() if n) or "No jobs yet.")
    gpus = jobs.gpu_use([j for j in shown if j.state == "running"])
    st.dataframe(
        job_views.job_rows(shown, gpus, now, where),
        hide_index=True,
        width="stretch",
        column_config={
            "state": st.column_config.TextColumn("state", width=90),  # "succeeded", "cancelled" whole
            "detail": st.column_config.TextColumn("detail", width="large"),
        },
    )
    return shown


FINAL = ("succeeded", "failed", "cancelled")


def _facts(job: JobInfo, events: list[JobEvent], now: float) -> None:
    """What the job is and what happened to it, as the hub says now."""
    st.subheader(views.plain(f"Job {job.id}: {job.name}"))  # its owner chose the name: shown, never rendered
    st.write(views.plain(job_views.detail(job, None, now, where)))
    spec = job.spec
    what = f"notebook {spec['notebook']}" if spec.get("notebook") else " ".join(spec.get("command") or [])
    st.code(what, language=None)
    st.caption(
        views.plain(
            f"{job.gpu}, image {job.image}, {job.priority}, time limit {spec.get('time_limit')}, "
            f"retries {spec.get('retries', 0)}; attempts {job.attempts}, preempted {counted(job.preemptions, 'time')}"
        )
    )
    st.dataframe(
        [{"when": views.clock_text(e.at, now, where), "state": e.state, "message": e.message} for e in events],
        hide_index=True,
        width="stretch",
    )


def _output(job: JobInfo) -> None:
    try:
        data, size = jobs.log_tail(identity, job.id)
    except (PermissionError, LookupError) as exc:
        st.error(str(exc))
        return
    cut = f" (the last {len(data) // 1024} KiB of {size // 1024} KiB)" if size > len(data) else ""
    st.caption(f"Output{cut}, as the job wrote it:")
    # st.code shows text as text: whatever a job prints (markup, HTML, escapes) is never rendered.
    st.code(job_views.printable(data) or "(nothing yet)", language=None)


def show_job(job_id: int) -> None:
    """The chosen job, re-read with the table while it can still change: its state, events and output follow
    the hub (a job that ends while the page is open says so without a reload), its buttons act on it as it is."""
    try:
        job, events = jobs.job(identity, job_id)
    except (PermissionError, LookupError) as exc:
        st.error(str(exc))
        return
    _facts(job, events, time.time())
    cancel_col, resubmit_col = st.columns(2)
    if job.state not in FINAL and cancel_col.button("Cancel", type="primary") and said.may_act("job", "cancel", job.id):
        said.act("job", lambda: jobs.cancel(identity, job.id), lambda after: f"Job {after.id}: {after.reason}")
    resubmit = job.user == identity.name and resubmit_col.button("Resubmit with the same settings")
    if resubmit and said.may_act("job", "resubmit", job.id):
        said.act("job", lambda: jobs.resubmit(identity, job.id), lambda after: f"Submitted as job {after.id}.")
    said.show("job")
    if job.user == identity.name or identity.admin:  # the hub says the same: output is its owner's and admins'
        _output(job)
    else:
        st.caption("A job's output is for its owner and admins.")


shown = live_table() or []
chosen = st.selectbox("Job", shown, format_func=_label, key="job")
if chosen is not None:
    # A job that ended when the page ran changes no more: read once. One that ends while shown is read
    # (from the cache, READ_TTL_S) until the next page run.
    st.fragment(show_job, run_every=None if chosen.state in FINAL else clients.REFRESH_S)(chosen.id)
    if (chosen.user == identity.name or identity.admin) and st.button("Prepare the whole output for download"):
        try:
            whole = jobs.whole_log(identity, chosen.id)
        except (PermissionError, LookupError) as exc:
            st.error(str(exc))
        else:
            st.download_button("Download", whole, file_name=f"job-{chosen.id}.log", mime="text/plain")
