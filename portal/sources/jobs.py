"""Batch jobs for the pages: read and acted on through the hub's jobs API with the reader's own token.

The hub answers each reader with what they may see (hub/jobs_api.py); a reader's answers are kept a
second, so a page refreshing twice a second asks the hub about once a second per reader.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from portal.data import jobs as data
from portal.data.prometheus import MetricsUnavailableError
from portal.identity import Identity
from portal.job_views import LOG_TAIL_BYTES, JobGpu, job_gpu
from portal.sources import clients, metrics

READ_TTL_S = 1.0


@st.cache_data(ttl=READ_TTL_S, show_spinner=False)
def jobs(identity: Identity) -> list[data.JobInfo]:
    return data.jobs(clients.acting_client(identity))


@st.cache_data(ttl=READ_TTL_S, show_spinner=False)
def job(identity: Identity, job_id: int) -> tuple[data.JobInfo, list[data.JobEvent]]:
    return data.job(clients.acting_client(identity), job_id)


@st.cache_data(ttl=READ_TTL_S, show_spinner=False)
def log_tail(identity: Identity, job_id: int) -> tuple[bytes, int]:
    """The end of a job's output, and its whole size (the hub refuses anyone but its owner and admins)."""
    return data.log(clients.acting_client(identity), job_id, tail=LOG_TAIL_BYTES)


def whole_log(identity: Identity, job_id: int) -> bytes:
    return data.log(clients.acting_client(identity), job_id, whole=True)[0]


def gpu_use(running: list[data.JobInfo]) -> dict[int, JobGpu]:
    """Each running job's GPU as the exporter's series show it; nothing where monitoring is off or down."""
    if not running:
        return {}
    try:
        memory, readings = metrics.job_gpu_memory(), metrics.gpu_readings()
    except MetricsUnavailableError:
        return {}
    return {j.id: job_gpu(j, memory, readings) for j in running}


def _done(identity: Identity) -> None:
    jobs.clear()  # the reader sees what they did at the next refresh
    job.clear()


def submit(identity: Identity, spec: dict[str, Any]) -> data.JobInfo:
    try:
        return data.submit(clients.acting_client(identity), spec)
    finally:
        _done(identity)


def cancel(identity: Identity, job_id: int) -> data.JobInfo:
    try:
        return data.act(clients.acting_client(identity), job_id, "cancel")
    finally:
        _done(identity)


def resubmit(identity: Identity, job_id: int) -> data.JobInfo:
    try:
        return data.act(clients.acting_client(identity), job_id, "resubmit")
    finally:
        _done(identity)
