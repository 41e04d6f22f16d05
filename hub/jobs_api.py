"""`/hub/api/gpuslice/jobs`: batch jobs, submitted, read and stopped with the caller's own token, on every hub.

The caller is always the token's user (a job runs as whoever submitted it: a body naming anyone
else is refused as an unknown key), and what they may see or do is decided here, on the server,
by the rules the GPU line's API uses (spawner/scope.py): owners their own jobs, a class's teachers
their students' (to see and cancel, not to read their output), admins all. What the token must
carry besides its user, from JupyterHub's own scopes: ``read:servers`` to read, ``servers`` to
submit, ``delete:servers`` to cancel (a job is work the platform runs for its owner, as a server is).
A job someone may not see is answered 404, as one that does not exist.

* ``GET  /jobs`` (``?state=queued,running``, ``?user=ann``): the jobs the caller may see, newest first;
  a queued one with its place in line, its estimated start and why it waits.
* ``POST /jobs`` (a ``JobSpec``): 201 with the job, in line; 400/403/409 with what to ask instead
  (nothing is written then).
* ``GET  /jobs/ID``: the job and its events. ``GET /jobs/ID/log`` (``?offset=BYTES``, ``?tail=BYTES``, ``?download=1``):
  its output, as text, for its owner and admins only.
* ``POST /jobs/ID/cancel``: out of line, or stopped (SIGTERM, the grace period, SIGKILL).
  ``POST /jobs/ID/resubmit``: a new job with the same settings, for its owner.

One machine or Kubernetes, the handler is the same: the ledger holds the jobs; the backend's
spawner plans them (spawner/job_request.py) and its dispatcher (hub/job_dispatch.py) runs them.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from pydantic import ValidationError
from tornado import web

from hub.job_dispatch import signal_runner
from hub.line_api import viewer_of
from spawner.checked import problems
from spawner.holds import group_bytes_of, servers_by_user
from spawner.job_ledger import JobLedger, JobRecord, TooManyQueuedError
from spawner.job_request import plan_job
from spawner.jobs import CANCEL, QUEUED, STATES, JobSpec, line_entry
from spawner.ledger import Held
from spawner.line import LineView, LogRead, WaitingLineMixin
from spawner.quotas import budgets
from spawner.request import GpuRefused
from spawner.scope import Scope
from spawner.waitline import budget_holding_back, estimated_start, fair_order, waits_for_room

READ_SCOPE, SUBMIT_SCOPE, CANCEL_SCOPE = "read:servers", "servers", "delete:servers"
LOG_CHUNK = 1024 * 1024  # the most of a log one read returns (the portal's tail; a download, a chunk at a time)
ReadLog = Callable[[LogRead], Awaitable[tuple[bytes, int]]]


async def log_chunks(read: ReadLog, first: bytes, size: int, chunk: int = LOG_CHUNK) -> AsyncIterator[bytes]:
    """A job's whole output from ``first`` (its first chunk, read at offset 0) on, a chunk at a time: the hub
    never holds more than one in memory. It ends at ``size`` (its size at the first read): a job still writing
    does not make a download endless."""
    offset, data = 0, first
    while data:
        yield data
        offset += len(data)
        if offset >= size:
            return
        data, _ = await read(LogRead(offset=offset, most=min(chunk, size - offset)))


def job_json(job: JobRecord, queue: dict[str, Any] | None = None, cards: Sequence[int] = ()) -> dict[str, Any]:
    """What the API says of a job (``queue``: its place in line, for a queued one; ``cards``: those it holds)."""
    now = time.time()
    return {
        "id": job.id,
        "user": job.user,
        "name": job.spec.title(),
        "state": job.state,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "attempts": job.attempts,
        "failures": job.failures,
        "preemptions": job.preemptions,
        "priority": job.spec.priority,
        "gpu": job.plan.label,
        "image": job.plan.image,
        "class": job.plan.group,
        "placed": job.placed,
        "cards": sorted(cards),
        "submitted": job.submitted,
        "started": job.started,
        "finished": job.finished,
        "elapsed_s": (now - job.started) if job.started and job.state in ("running", "stopping") else None,
        "spec": job.spec.to_json(),
        **({"queue": queue} if queue is not None else {}),
    }


class JobsBase(APIHandler):  # type: ignore[misc]
    def _caller(self, scope: str) -> Any:
        """The token's user; 403 for no token, a service's, or one without ``scope``."""
        user = self.current_user
        if user is None or getattr(user, "kind", "") != "user":
            raise web.HTTPError(403, "the jobs API answers users: send your own token (from /hub/token)")
        if scope not in self.parsed_scopes:
            raise web.HTTPError(403, f"this token may not {_doing(scope)} jobs (it lacks the {scope} scope)")
        return user

    def _spawner(self, user: Any) -> WaitingLineMixin:
        spawner = user.spawner
        if not isinstance(spawner, WaitingLineMixin):
            raise web.HTTPError(404, "this hub's spawner runs no jobs")
        return spawner

    def _ledger(self, user: Any) -> JobLedger:
        return JobLedger(self._spawner(user).gpu_ledger_path)

    def _scope(self, user: Any) -> Scope:
        rules = self._spawner(user).gpu_group_rules
        groups = {} if user.admin else {g.name: [u.name for u in g.users] for g in self.db.query(orm.Group)}
        return viewer_of(user.name, bool(user.admin), rules, groups)[0]

    def _visible(self, user: Any, job_id: int) -> tuple[JobLedger, JobRecord]:
        """The job, if the caller may see it; 404 otherwise (another's job is not there for them)."""
        ledger = self._ledger(user)
        job = ledger.job(job_id)
        if job is None or not self._scope(user).sees(job.user):
            raise web.HTTPError(404, f"no job {job_id} of yours (or of a class you teach)")
        return ledger, job

    def _send(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    async def _queue(self, user: Any, ledger: JobLedger, jobs: Sequence[JobRecord]) -> dict[int, dict[str, Any]]:
        """Each queued job's place in line, estimated start and why it waits."""
        queued = [j for j in jobs if j.state == QUEUED]
        if not queued:
            return {}
        spawner = self._spawner(user)
        holds = await spawner.gpu_holds()
        now = time.time()
        line = ledger.line()
        budget_of = budgets(spawner.gpu_group_rules)
        frees_at = _frees_at(spawner, ledger, holds, now)
        present = [e for e in line if waits_for_room(e, now) or e.backfill]
        order = fair_order(present, servers_by_user(holds))  # once for all: a long line is read in one pass
        place = {e.key: i for i, e in enumerate(order, start=1)}
        used = group_bytes_of(holds)
        ends = sorted(frees_at.get(h.key, now) for h in holds)
        found = {}
        for job in queued:
            me = next((e for e in order if e.key == job.key), None)
            if me is None:
                continue
            position = place[me.key]
            group = budget_holding_back(me, budget_of, used)
            if group is None:
                view = LineView(position, holds, position)
                eta = estimated_start(position, ends, now)
            else:
                ahead = sum(1 for e in order[: position - 1] if e.group == group) + 1
                freeing = [h for h in holds if h.group == group]
                view = LineView(position, freeing, ahead, group)
                eta = estimated_start(ahead, [frees_at.get(h.key, now) for h in freeing], now)
            found[job.id] = {"position": position, "estimated_start": eta, "why": _why(job, view, present)}
        return found


def _cards(ledger: JobLedger) -> dict[str, list[int]]:
    """The cards each job holds (the ledger's rows, by job key)."""
    found: dict[str, list[int]] = {}
    for hold in ledger.holdings():
        found.setdefault(hold.key, []).append(hold.gpu_index)
    return found


def _doing(scope: str) -> str:
    return {READ_SCOPE: "read", SUBMIT_SCOPE: "submit", CANCEL_SCOPE: "cancel"}.get(scope, "use")


def _why(job: JobRecord, view: LineView, present: Sequence[Any]) -> str:
    """Why a queued job waits, in words."""
    if job.spec.backfill:
        return "backfill: it runs on a slice nobody waits for, once every person's request is placed"
    if view.budget_group:
        return f"class {view.budget_group} is using its whole GPU budget: it starts when a classmate's slice ends"
    ahead = view.position - 1
    if ahead:
        return f"{ahead} request(s) are ahead of it in the GPU line"
    return f"no card has {job.plan.label} free now: it starts when a slice ends"


def _frees_at(spawner: WaitingLineMixin, ledger: JobLedger, holds: list[Held], now: float) -> dict[str, float]:
    """When each holder ends at the latest: a job at its time limit, a server when reclaiming would stop it."""
    jobs = {j.key: j for j in ledger.jobs(states=["starting", "running", "stopping"])}
    ends = spawner.gpu_ends([h for h in holds if h.key not in jobs], now)
    for key, job in jobs.items():
        ends[key] = (job.started or now) + job.spec.time_limit_s
    return ends


class JobsHandler(JobsBase):
    async def get(self) -> None:
        user = self._caller(READ_SCOPE)
        scope = self._scope(user)
        ledger = self._ledger(user)
        states = [s for s in self.get_argument("state", "").split(",") if s]
        if any(s not in STATES for s in states):
            raise web.HTTPError(400, f"state must be one or more of {', '.join(STATES)}")
        wanted = self.get_argument("user", "")
        users = None if scope.everyone else sorted(scope.users | {scope.viewer})
        if wanted:
            users = [wanted] if scope.sees(wanted) else []
        jobs = ledger.jobs(users, states or None)
        queue = await self._queue(user, ledger, jobs)
        cards = _cards(ledger)
        self._send({"jobs": [job_json(j, queue.get(j.id), cards.get(j.key, ())) for j in jobs]})

    async def post(self) -> None:
        user = self._caller(SUBMIT_SCOPE)
        try:
            spec = JobSpec.model_validate(self.get_json_body() or {})
        except ValidationError as exc:
            raise web.HTTPError(400, problems(exc)) from None
        job = await self._submit(user, spec)
        self._send({"job": job_json(job)}, 201)

    async def _submit(self, user: Any, spec: JobSpec) -> JobRecord:
        spawner = self._spawner(user)
        try:
            await spawner._refresh_view()  # on Kubernetes the cluster's cards, as a spawn reads them
            plan = plan_job(spawner, spec)  # type: ignore[arg-type]
            return self._ledger(user).submit(
                user.name, spec, plan, lambda job_id, now: line_entry(job_id, user.name, spec, plan, now, now)
            )
        except GpuRefused as refused:
            raise web.HTTPError(refused.status_code, refused.jupyterhub_message) from None
        except TooManyQueuedError as exc:
            raise web.HTTPError(429, str(exc)) from None


class JobHandler(JobsBase):
    async def get(self, job_id: str) -> None:
        user = self._caller(READ_SCOPE)
        ledger, job = self._visible(user, int(job_id))
        queue = await self._queue(user, ledger, [job])
        events = [{"state": e.state, "message": e.message, "at": e.created} for e in ledger.events(job.id)]
        self._send({"job": job_json(job, queue.get(job.id), _cards(ledger).get(job.key, ())), "events": events})


class JobLogHandler(JobsBase):
    async def get(self, job_id: str) -> None:
        user = self._caller(READ_SCOPE)
        _, job = self._visible(user, int(job_id))
        if not (user.admin or job.user == user.name):
            raise web.HTTPError(403, "a job's output is for its owner and admins only")
        try:
            offset = max(0, int(self.get_argument("offset", "0")))
            tail = max(0, int(self.get_argument("tail", "0")))
        except ValueError:
            raise web.HTTPError(400, "offset and tail must be whole numbers of bytes") from None
        download = self.get_argument("download", "") not in ("", "0")
        wanted = LogRead(offset=0 if download else offset, tail=0 if download else tail, most=LOG_CHUNK)
        read = self._spawner(user).gpu_job_log
        data, size = await read(job, wanted)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Log-Size", str(size))
        if not download:
            self.finish(data)
            return
        self.set_header("Content-Disposition", f'attachment; filename="job-{job.id}.log"')
        async for piece in log_chunks(lambda window: read(job, window), data, size):
            self.write(piece)
            await self.flush()  # each chunk goes before the next is read
        self.finish()


class JobActionHandler(JobsBase):
    async def post(self, job_id: str, action: str) -> None:
        if action == "cancel":
            user = self._caller(CANCEL_SCOPE)
            ledger, job = self._visible(user, int(job_id))
            who = user.name if job.user == user.name else f"{user.name} ({'an admin' if user.admin else 'a teacher'})"
            found = ledger.ask_stop(job.id, CANCEL, f"cancelled by {who}")
            after = ledger.job(job.id)
            if found is not None and after is not None and after.state == "stopping":
                signal_runner(after)  # locally: its runner stops it now (on Kubernetes the dispatcher deletes it)
            self._send({"job": job_json(after or job)})
            return
        user = self._caller(SUBMIT_SCOPE)
        _, job = self._visible(user, int(job_id))
        if job.user != user.name:
            raise web.HTTPError(403, "only its owner may resubmit a job: it runs as whoever submits it")
        self._send({"job": job_json(await self._submit(user, job.spec))}, 201)


# On every hub (hub/wiring.py configure_hub).
JOBS_HANDLERS = [
    (r"/api/gpuslice/jobs", JobsHandler),
    (r"/api/gpuslice/jobs/([0-9]+)", JobHandler),
    (r"/api/gpuslice/jobs/([0-9]+)/log", JobLogHandler),
    (r"/api/gpuslice/jobs/([0-9]+)/(cancel|resubmit)", JobActionHandler),
]
