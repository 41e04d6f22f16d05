"""The job dispatcher on Kubernetes: jobs from the GPU line to ``batch/v1`` Jobs, and their ends back.

The same look at the line as on one machine (hub/job_dispatch.py ``decide``, one ledger
transaction), over the cluster as the sharing backend reads it (nodes, the namespace's pods, the
backend's own lists: spawner/sharing/), so notebook pods and job pods hold room alike. A job the line
places becomes a Job (spawner/job_kube.py ``job_manifest``): no Job, no pod, until then. Its room is
held by a row of the ledger's ``placing``, written in the look that places it, until its pod is listed;
the hub's spawns count those rows, and this look counts theirs (spawner/kube.py). Each look also reads every Job this
service made (label ``app.kubernetes.io/managed-by=gpuslice``) and writes to the ledger what their
conditions say: running, succeeded, failed (the last pod's exit code and why; past its deadline: the
time limit). A job asked to stop (a cancel, a preemption for a person) has its Job deleted: its pod
gets SIGTERM and the grace period (``terminationGracePeriodSeconds``) before SIGKILL, as the Job
controller and the kubelet do it; once the Job is gone the job is cancelled, or back in line. A Job
gone that nobody stopped is a lost attempt (retried as the job's retries allow). Everything is read
from the cluster at each look: a restarted hub's dispatcher carries on where the last one was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from hub.job_dispatch import decide
from spawner import sharing
from spawner.cgroups import DEFAULT_LIMITS
from spawner.inventory import GROUP_ANNOTATION, Allocation, Inventory, Pending, with_pending
from spawner.job_kube import JobPod, Observed, job_manifest, job_name, observed
from spawner.job_ledger import Dispatch, JobLedger, JobRecord, Looked, Placement
from spawner.jobs import (
    FINISHED,
    JOB_MARK,
    LOST,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPING,
    Ending,
    Outcome,
    executed_path,
    job_env,
    line_entry,
    notebook_path,
    outcome,
)
from spawner.kube import _items, _send
from spawner.ledger import Held, Placing, server_key
from spawner.placement import Choice
from spawner.quotas import budgets
from spawner.shares import RequestKind
from spawner.sharing.base import Listing, SharingBackend, Target
from spawner.waitline import Entry, Reservation

log = logging.getLogger("gpuslice.jobs")
LOG_TAIL_LINES = 200  # of a failed pod's log, for the reason in words (out of GPU memory)
LOST_AFTER_S = 30.0  # a placed job whose Job is not there this long after its creation is taken for lost


@dataclass
class KubeJobs:
    """The dispatcher's state on a cluster between looks: the Jobs it made and deleted."""

    ledger: JobLedger
    api: Any  # a kubernetes_asyncio CoreV1Api (its api_client makes the raw calls)
    backend: SharingBackend
    pod: JobPod
    rules: Any  # () -> the groups' rules now
    policy: str = "default"
    most_cpu_jobs: int = DEFAULT_LIMITS.cpu_jobs  # the settings' limits.cpu_jobs
    created: dict[str, float] = field(default_factory=dict)  # Job name -> when this process created it
    deleting: set[str] = field(default_factory=set)

    def _path(self, what: str, name: str = "") -> str:
        base = {"jobs": "/apis/batch/v1", "pods": "/api/v1"}[what]
        return f"{base}/namespaces/{self.pod.namespace}/{what}{'/' + name if name else ''}"

    async def _get(self, path: str) -> Any:
        return await self.api.api_client.call_api(
            path,
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
        )

    async def _listing(self) -> tuple[Listing, list[dict[str, Any]]]:
        nodes = await _items(self._get("/api/v1/nodes"))
        pods = await _items(self._get(self._path("pods")))
        jobs = await _items(self._get(f"{self._path('jobs')}?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpuslice"))
        objects = {read.key: await _items(self._get(read.path)) for read in self.backend.reads}
        return Listing(nodes, pods, objects, now=datetime.now(UTC)), jobs

    async def step(self, now: float) -> None:
        listing, jobs = await self._listing()
        fitted, listed = sharing.read(self.backend, listing)
        budgets_now = budgets(list(self.rules()))
        chosen: dict[int, Choice | None] = {}
        placing = Placing()

        def look(_rows: list[Held], line: list[Entry], reservations: list[Reservation], records: Looked) -> Dispatch:
            inventory, holds = counting(listed, listing.pods, placing.seen)
            return decide(
                holds,
                line,
                reservations,
                records,
                inventory_of=lambda _: inventory,
                words=lambda rows: "",
                budgets_now=budgets_now,
                policy=self.policy,
                now=now,
                rows_for=rows_for,
                most_cpu_jobs=self.most_cpu_jobs,
            )

        def rows_for(job: JobRecord, counted: Inventory, _group: str | None, choice: Choice | None) -> list[Held]:
            chosen[job.id] = choice
            placed = _placed(job, counted, choice, now)
            if placed is not None:
                placing.made.append(placed)  # written with the job's placement, in the same transaction
            return []  # the pod is the hold: the ledger keeps no allocation rows on a cluster

        decided, active = self.ledger.dispatch(look, placing)
        for placement in decided.placements:
            job = active.get(placement.job)
            if job is not None:
                await self._create(job, fitted, listed, chosen.get(job.id), placement)  # same nodes and cards
        await self._follow(active, jobs, listing.pods)

    async def _create(
        self, job: JobRecord, fitted: SharingBackend, inventory: Inventory, choice: Choice | None, placed: Placement
    ) -> None:
        request = job.plan.request
        card = inventory.nodes[choice.node].gpus[choice.gpus[0]] if choice is not None and choice.gpus else None
        target = Target(
            card_bytes=card.memory_bytes if card else None,
            product=card.model if card else "",
            uuid=card.uuid if card else "",
            group=job.plan.group,
        )
        name = job_name(job.id, job.attempts)
        manifest = job_manifest(
            name=name,
            job_id=job.id,
            user=job.user,
            group=job.plan.group,
            asked_bytes=job.plan.asked_bytes,
            image=job.plan.target,
            command=_command(job),
            env={**job.spec.env, "PYTHONUNBUFFERED": "1", **job_env(job.id, job.attempts, job.spec, job.preemptions)},
            gpu=fitted.render(request, target),
            holds_gpu=request.kind is not RequestKind.CPU,
            retries=job.spec.retries,
            time_limit_s=job.spec.time_limit_s,
            cpus=job.plan.cpus,
            memory_bytes=job.plan.memory_bytes,
            models=job.plan.models,
            pod=self.pod,
        )
        try:
            status = await _send(self.api, "POST", self._path("jobs"), manifest)
        except ApiException as exc:
            ending = Ending(None, start_error=f"the cluster refused its Job (HTTP {exc.status} {exc.reason})")
            self._finish(job, ending)
            return
        self.created[name] = time.monotonic()
        where = f"{card.model} on {inventory.nodes[choice.node].name}" if card is not None and choice else "no GPU"
        self.ledger.unit_started(job.id, name, f"{job.plan.label}: {where}")
        log.info("gpuslice jobs: job %s (%s) is Job %s (HTTP %s)", job.id, job.user, name, status)

    async def _follow(
        self, active: dict[int, JobRecord], jobs: list[dict[str, Any]], pods: Sequence[Mapping[str, Any]]
    ) -> None:
        """Write what each active job's Job says; delete the Jobs of those asked to stop."""
        by_name = {j["metadata"]["name"]: j for j in jobs}
        for job in active.values():
            name = job.unit or job_name(job.id, job.attempts)
            found = by_name.get(name)
            mine = [dict(p) for p in pods if (p["metadata"].get("labels") or {}).get("job-name") == name]
            if job.state == STOPPING:
                await self._stopping(job, name, found)
            elif found is None and not job.unit and name not in self.created:
                # Placed, but its Job never made (the hub stopped in between): back in line, its place kept.
                requeue = line_entry(job.id, job.user, job.spec, job.plan, job.submitted, time.time())
                self.ledger.finish(job.id, Outcome(QUEUED, "its Job was never made; back in line"), None, requeue)
            elif found is None:
                if time.monotonic() - self.created.get(name, -1e9) > LOST_AFTER_S:
                    self._finish(job, Ending(None, LOST, f"its Job {name} is gone"))
            else:
                await self._observe(job, observed(found, mine))

    async def _stopping(self, job: JobRecord, name: str, found: dict[str, Any] | None) -> None:
        if found is not None:
            if name not in self.deleting:
                body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
                await _send(self.api, "DELETE", self._path("jobs", name), body)
                self.deleting.add(name)
            return
        self.deleting.discard(name)
        self._finish(job, Ending(None, job.stop_kind, job.stop_reason))

    async def _observe(self, job: JobRecord, now: Observed) -> None:
        if now.state == RUNNING and job.state == STARTING:
            self.ledger.unit_running(job.id)
        elif now.state in FINISHED:
            tail = await self._log_tail(now.pod) if now.state != "succeeded" else ""
            code = -9 if now.reason == "OOMKilled" else now.exit_code
            self._finish(job, Ending(code, now.stop_kind, now.reason, tail), retried=True)

    async def _log_tail(self, pod: str) -> str:
        if not pod:
            return ""
        try:
            response = await self._get(f"{self._path('pods', pod)}/log?tailLines={LOG_TAIL_LINES}")
            return str((await response.read()).decode(errors="replace"))
        except (ApiException, OSError):
            return ""

    def _finish(self, job: JobRecord, ending: Ending, retried: bool = False) -> None:
        """The attempt's end in the ledger; ``retried``: the Job controller already used the retries."""
        result = outcome(
            ending,
            failures_before=job.spec.retries if retried else job.failures,
            retries=job.spec.retries,
            time_limit_s=job.spec.time_limit_s,
            slice_words=job.plan.label,
        )
        requeue = line_entry(job.id, job.user, job.spec, job.plan, job.submitted, time.time())
        after = self.ledger.finish(job.id, result, ending.exit_code, requeue)  # its placing row goes with it
        log.info("gpuslice jobs: job %s (%s) %s: %s", job.id, job.user, after.state if after else "?", result.reason)


def counting(
    listed: Inventory, pods: Sequence[Mapping[str, Any]], placing: list[Pending]
) -> tuple[Inventory, list[Held]]:
    """The cluster as listed with the placements (the ledger's ``placing``: the hub's spawns' and this
    service's) it does not count yet, and what it holds as ledger rows."""
    inventory, live = with_pending(listed, pods, placing, time.time())
    groups = {p.pod: p.group for p in live}
    for pod in pods:
        meta = pod.get("metadata", {})
        groups[meta.get("name", "")] = (meta.get("annotations") or {}).get(GROUP_ANNOTATION)
    holds = [
        Held(server_key(a.user, a.server), gpu.index, a.user, a.server, a.memory_bytes, a.whole, groups.get(a.owner))
        for gpu, a in inventory.allocations()
    ]
    return inventory, holds


def _placed(job: JobRecord, inventory: Inventory, choice: Choice | None, now: float) -> Pending | None:
    """The room a job's placement takes until its pod is listed (None: it holds no GPU). ``job``: as queued (its
    Job is named for the attempt this placement begins)."""
    if choice is None or not choice.gpus:
        return None
    request = job.plan.request
    node = inventory.nodes[choice.node]
    card = node.gpus[choice.gpus[0]].memory_bytes
    whole = request.kind is RequestKind.WHOLE
    name = job_name(job.id, job.attempts + 1)
    allocation = Allocation(job.user, f"{JOB_MARK}{job.id}", card if whole else request.bytes_on(card), name, whole)
    return Pending(name, node.name, choice.gpus, allocation, job.plan.group, job.plan.asked_bytes, now)


def _command(job: JobRecord) -> list[str]:
    """The container's command: the job's, or its notebook run through nbclient (the image's kernel hook folder
    carries spawner/kernel_hook/gpuslice_notebook.py, as a notebook pod's does)."""
    if job.spec.notebook is not None:
        notebook = notebook_path(job.spec.notebook)
        return ["python", "-m", "gpuslice_notebook", str(notebook), str(executed_path(notebook, job.id))]
    return list(job.spec.command or ())


async def run(kube: KubeJobs, interval: float) -> None:
    while True:
        try:
            await kube.step(time.time())
        except Exception:  # one bad look (the API busy) is not the last
            log.exception("gpuslice jobs: a look at the line failed; trying again")
        await asyncio.sleep(interval)


def job_pod_from_args(namespace: str, scheduler_name: str, models_claim: str, home_claim: str, ttl_s: int) -> JobPod:
    models = {"persistentVolumeClaim": {"claimName": models_claim, "readOnly": True}} if models_claim else None
    return JobPod(namespace, scheduler_name, models_volume=models, home_claim=home_claim, ttl_s=ttl_s)
