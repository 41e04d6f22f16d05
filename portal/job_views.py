"""Batch jobs as the Jobs page shows them: one row per job, what it is doing in words. Pure code.

A queued job says its place in line, when it may start and why it waits; a running one how long it
has run, where, and (where monitoring runs) the GPU memory its processes use, from the exporter's
per-process series, and its card's utilization; a finished one its exit code and the reason in words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import tzinfo

from portal.data.jobs import JobInfo
from portal.data.prometheus import GpuReading
from portal.views import clock_text, duration_text, when_text
from spawner.jobs import FINISHED, job_server
from spawner.shares import format_bytes

JOB_STATES = ("queued", "starting", "running", "stopping", "succeeded", "failed", "cancelled")
LOG_TAIL_BYTES = 64 * 1024  # what the page shows of a job's output (the whole of it is a download)


@dataclass(frozen=True)
class JobGpu:
    """What a running job's GPU shows now: its processes' memory, its cards' utilization (None: no reading)."""

    memory_bytes: float | None
    utilization_pct: float | None


def job_gpu(
    job: JobInfo, memory: Mapping[tuple[str, str], float], readings: Mapping[tuple[str, str], GpuReading]
) -> JobGpu:
    """The exporter's series joined to the job: its own processes by owner and job, its cards by index."""
    used = memory.get((job.user, job_server(job.id)))
    cards = [r.utilization_pct for (_, gpu), r in readings.items() if gpu in {str(c) for c in job.cards}]
    return JobGpu(used, sum(cards) / len(cards) if cards else None)


def detail(job: JobInfo, gpu: JobGpu | None, now: float, where: tzinfo) -> str:
    """What the job is doing, in words (times in the reader's clock)."""
    if job.state == "queued":
        place = f"#{job.position} in line" if job.position else "in line"
        eta = f", expected {when_text(job.estimated_start, now, where)}" if job.estimated_start else ""
        return f"{place}{eta}: {job.why or job.reason}"
    if job.state == "running":
        parts = [f"running {duration_text(job.elapsed_s)}", f"on {job.placed or 'no GPU'}"]
        if gpu is not None and gpu.memory_bytes is not None:
            parts.append(f"using {format_bytes(int(gpu.memory_bytes))} of GPU memory")
        if gpu is not None and gpu.utilization_pct is not None:
            parts.append(f"card {gpu.utilization_pct:.0f}% busy")
        return ", ".join(parts)
    if job.state in FINISHED:
        code = f"exit code {job.exit_code}: " if job.exit_code is not None and job.state == "failed" else ""
        return f"{code}{job.reason}"
    return job.reason


def job_rows(jobs: list[JobInfo], gpus: Mapping[int, JobGpu], now: float, where: tzinfo) -> list[dict[str, object]]:
    """The Jobs table (st.dataframe escapes every cell: what users wrote is shown as text)."""
    return [
        {
            "id": j.id,
            "user": j.user,
            "name": j.name,
            "state": j.state,
            "GPU": j.gpu,
            "image": j.image,
            "priority": j.priority,
            "submitted": clock_text(j.submitted, now, where),
            "detail": detail(j, gpus.get(j.id), now, where),
        }
        for j in jobs
    ]


def job_matches(job: JobInfo, states: set[str], search: str) -> bool:
    if states and job.state not in states:
        return False
    needle = search.strip().lower()
    return not needle or needle in f"{job.user} {job.name} {job.image} {job.id}".lower()


def printable(log: bytes) -> str:
    """A job's output as text to show: bytes that are not UTF-8 replaced, terminal escapes taken out (shown as
    st.code, which renders nothing of what it holds)."""
    text = log.decode(errors="replace")
    return "".join(ch if ch in "\n\t" or ch >= " " else "\ufffd" for ch in text if ch != "\r")
