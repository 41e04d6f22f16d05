"""Batch jobs from the hub's jobs API (hub/jobs_api.py), always with the reader's own token.

The hub decides what each reader may see and do (owners their jobs, a class's teachers their
students', admins all; output for owners and admins): the portal shows what it answers and says
its refusals in its words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests

from portal.data.errors import SourceUnavailableError
from portal.data.hub import HubClient

JOBS_PATH = "/gpuslice/jobs"


@dataclass(frozen=True)
class JobInfo:
    """One job, as the hub's API says it."""

    id: int
    user: str
    name: str
    state: str
    reason: str
    gpu: str
    image: str
    priority: str
    submitted: float
    exit_code: int | None = None
    attempts: int = 0
    preemptions: int = 0
    group: str | None = None
    placed: str = ""
    cards: tuple[int, ...] = ()
    started: float | None = None
    finished: float | None = None
    elapsed_s: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    position: int | None = None
    estimated_start: float | None = None
    why: str = ""


@dataclass(frozen=True)
class JobEvent:
    state: str
    message: str
    at: float


def job_info(body: dict[str, Any]) -> JobInfo:
    queue = body.get("queue") or {}
    return JobInfo(
        id=int(body["id"]),
        user=str(body["user"]),
        name=str(body["name"]),
        state=str(body["state"]),
        reason=str(body["reason"]),
        gpu=str(body["gpu"]),
        image=str(body["image"]),
        priority=str(body["priority"]),
        submitted=float(body["submitted"]),
        exit_code=body.get("exit_code"),
        attempts=int(body.get("attempts") or 0),
        preemptions=int(body.get("preemptions") or 0),
        group=body.get("class"),
        placed=str(body.get("placed") or ""),
        cards=tuple(int(c) for c in body.get("cards") or ()),
        started=body.get("started"),
        finished=body.get("finished"),
        elapsed_s=body.get("elapsed_s"),
        spec=dict(body.get("spec") or {}),
        position=queue.get("position"),
        estimated_start=queue.get("estimated_start"),
        why=str(queue.get("why") or ""),
    )


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.reason or "no reason given"
    return str(body.get("message") or response.reason) if isinstance(body, dict) else str(body)


def _checked(response: requests.Response, what: str) -> requests.Response:
    """The answer, or the hub's refusal as an error people read: 403 PermissionError, 404 LookupError,
    400/409/429 ValueError (what to ask instead); anything else: the hub is not answering as it should."""
    if response.status_code < 300:
        return response
    if response.status_code == 403:
        raise PermissionError(f"The hub refused: {_message(response)}")
    if response.status_code == 404:
        raise LookupError(_message(response))
    if response.status_code in (400, 409, 429):
        raise ValueError(_message(response))
    raise SourceUnavailableError(f"{what}: the hub answered HTTP {response.status_code}: {_message(response)}")


def jobs(client: HubClient) -> list[JobInfo]:
    """The jobs this client's user may see, newest first."""
    body = _checked(client.get_response(JOBS_PATH), "The jobs").json()
    return [job_info(j) for j in body["jobs"]]


def job(client: HubClient, job_id: int) -> tuple[JobInfo, list[JobEvent]]:
    body = _checked(client.get_response(f"{JOBS_PATH}/{job_id}"), "A job").json()
    return job_info(body["job"]), [JobEvent(str(e["state"]), str(e["message"]), float(e["at"])) for e in body["events"]]


def log(client: HubClient, job_id: int, tail: int = 0, whole: bool = False) -> tuple[bytes, int]:
    """The job's output (its last ``tail`` bytes, or ``whole``), and its whole size now."""
    query = "download=1" if whole else f"tail={tail}"
    response = _checked(client.get_response(f"{JOBS_PATH}/{job_id}/log?{query}"), "A job's output")
    return response.content, int(response.headers.get("X-Log-Size", "0"))


def submit(client: HubClient, spec: dict[str, Any]) -> JobInfo:
    return job_info(_checked(client.post(JOBS_PATH, spec), "Submitting a job").json()["job"])


def act(client: HubClient, job_id: int, action: str) -> JobInfo:
    """Cancel or resubmit a job (the hub checks who may)."""
    return job_info(_checked(client.post(f"{JOBS_PATH}/{job_id}/{action}", {}), "A job").json()["job"])
