"""The API double's Job controller and TTL-after-finished controller, as kube-controller-manager runs them.

Read from Kubernetes' own source, pkg/controller/job/job_controller.go (``syncJob``, ``manageJob``,
``newFailureCondition``/``newSuccessCondition``, ``pastActiveDeadline``) and pkg/controller/job/backoff_utils.go,
with the JobPodReplacementPolicy and JobManagedBy gates on as they are by default since 1.31
(``delayTerminalCondition``). What it does, for Jobs with ``completions`` and ``parallelism`` of 1
(what gpuslice makes; an Indexed Job, a podFailurePolicy or a successPolicy is out of its scope):

* a Job that is not suspended gets ``status.startTime`` at its first sync, and a pod made from its
  template (``generateName: <job>-``, the template's labels, which the Job's defaults already carry:
  ``batch.kubernetes.io/job-name``, ``controller-uid``), owned by it (``ownerReferences`` with
  ``controller: true`` and ``blockOwnerDeletion: true``), so that deleting the Job collects its pods;
* a pod that fails is counted in ``status.failed``; while ``failed <= backoffLimit`` a new pod is made,
  after the pod-failure backoff: ``DefaultJobPodFailureBackOff`` (10 s) doubled for each failure in a row,
  at most ``MaxJobPodFailureBackOff`` (10 min);
* ``failed > backoffLimit`` ("exceedsBackoffLimit") gives reason ``BackoffLimitExceeded``, "Job has reached the
  specified backoff limit"; past ``activeDeadlineSeconds`` from ``startTime`` ("pastActiveDeadline") reason
  ``DeadlineExceeded``, "Job was active longer than specified deadline"; either way the active pods are
  deleted (their grace period: SIGTERM, then SIGKILL), the interim ``FailureTarget`` condition is written at
  once and ``Failed`` (same reason and message) once no pod of the Job is left running or terminating;
* a pod that succeeds is counted in ``status.succeeded``; with ``succeeded >= completions`` and nothing active
  the Job gets ``SuccessCriteriaMet``, then ``Complete`` and ``status.completionTime``;
* ``status.active`` counts the pods neither finished nor being deleted, ``status.ready`` those Ready,
  ``status.terminating`` those being deleted;
* the TTL-after-finished controller (pkg/controller/ttlafterfinished) deletes a finished Job
  ``ttlSecondsAfterFinished`` after its Complete or Failed condition, in the foreground (its pods first).

It wakes at every change of the store (a pod's phase, a Job made or deleted) and at the next backoff,
deadline or TTL it knows of, as the real controller's queue does with ``AddAfter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from datetime import UTC, datetime
from typing import Any

from tests.kube.api.rest import Rest
from tests.kube.api.store import Store, now

Obj = dict[str, Any]
JOBS = "jobs.batch"
POD_FAILURE_BACKOFF_S = 10.0  # DefaultJobPodFailureBackOff
MAX_POD_FAILURE_BACKOFF_S = 600.0  # MaxJobPodFailureBackOff
FAILED_MESSAGES = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "DeadlineExceeded": "Job was active longer than specified deadline",
}


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _true(job: Obj, kind: str) -> Obj | None:
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == kind and c["status"] == "True"), None)


def _condition(kind: str, reason: str = "", message: str = "") -> Obj:
    stamp = now()
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
    }


def _finished(job: Obj) -> Obj | None:
    return _true(job, "Complete") or _true(job, "Failed")


class JobController:
    """Syncs every Job at each change of the store (see the module's docstring)."""

    def __init__(self, store: Store, rest: Rest) -> None:
        self.store, self.rest = store, rest
        self.counted: dict[str, set[str]] = {}  # Job uid -> uids of its finished pods already counted
        self.failed_in_a_row: dict[str, int] = {}  # Job uid -> failures since its last success
        self.last_failure: dict[str, float] = {}  # Job uid -> when its last pod failed (the backoff runs from it)
        self.wake_at: float | None = None

    async def run(self) -> None:
        while True:
            self.wake_at = None
            for job in list(self.store.items(JOBS, None)):
                with contextlib.suppress(Exception):  # one Job's trouble never stops the others' sync
                    await self.sync(job)
            async with self.store.changed:
                timeout = None if self.wake_at is None else max(0.05, self.wake_at - asyncio.get_running_loop().time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.store.changed.wait(), timeout)

    def _later(self, seconds: float) -> None:
        at = asyncio.get_running_loop().time() + max(0.0, seconds)
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    def _pods(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return [
            p
            for p in self.store.items("pods", job["metadata"]["namespace"])
            if any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])
        ]

    async def sync(self, job: Obj) -> None:
        meta, spec, status = job["metadata"], job["spec"], job.setdefault("status", {})
        if meta.get("deletionTimestamp"):
            return
        if _finished(job):
            await self._expire(job)
            return
        before = copy.deepcopy(status)
        pods = self._pods(job)
        active = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]
        running = [p for p in active if not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in active if p["metadata"].get("deletionTimestamp")]
        self._count(job, pods)
        if status.get("startTime") is None and not spec.get("suspend"):
            status["startTime"] = now()
        target = _true(job, "FailureTarget")
        reason = target.get("reason") if target else self._failure(job)
        if reason:
            for pod in running:  # deleteActivePods: graceful, as a client's DELETE is
                await self.rest.delete_pod(pod, None)
            if not target:
                status.setdefault("conditions", []).append(_condition("FailureTarget", reason, FAILED_MESSAGES[reason]))
            if not self._pods_left(job):
                status["conditions"].append(_condition("Failed", reason, FAILED_MESSAGES[reason]))
        elif int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1) and not running:
            if not _true(job, "SuccessCriteriaMet"):
                status.setdefault("conditions", []).append(_condition("SuccessCriteriaMet", "CompletionsReached"))
            if not terminating:
                status["conditions"].append(_condition("Complete", "CompletionsReached"))
                status["completionTime"] = now()
        elif not running and not spec.get("suspend"):
            await self._replace_pod(job)
        self._deadline_wake(job)
        status["active"] = len(self._running(job))
        status["ready"] = sum(1 for p in self._running(job) if _ready(p))
        status["terminating"] = sum(1 for p in self._pods(job) if p["metadata"].get("deletionTimestamp"))
        if status != before:
            await self.store.put(JOBS, meta["namespace"], job, "MODIFIED")

    def _running(self, job: Obj) -> list[Obj]:
        return [
            p
            for p in self._pods(job)
            if p["status"].get("phase") not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")
        ]

    def _pods_left(self, job: Obj) -> bool:
        return any(p["status"].get("phase") not in ("Succeeded", "Failed") for p in self._pods(job))

    def _count(self, job: Obj, pods: list[Obj]) -> None:
        """Finished pods counted once each in succeeded or failed (the real one tracks them with a finalizer)."""
        uid, status = job["metadata"]["uid"], job["status"]
        counted = self.counted.setdefault(uid, set())
        for pod in pods:
            phase = pod["status"].get("phase")
            if phase not in ("Succeeded", "Failed") or pod["metadata"]["uid"] in counted:
                continue
            counted.add(pod["metadata"]["uid"])
            if phase == "Succeeded":
                status["succeeded"] = int(status.get("succeeded") or 0) + 1
                self.failed_in_a_row[uid] = 0
            else:
                status["failed"] = int(status.get("failed") or 0) + 1
                self.failed_in_a_row[uid] = self.failed_in_a_row.get(uid, 0) + 1
                self.last_failure[uid] = asyncio.get_running_loop().time()

    def _failure(self, job: Obj) -> str:
        """exceedsBackoffLimit, then pastActiveDeadline, as syncJob checks them."""
        spec, status = job["spec"], job["status"]
        if int(status.get("failed") or 0) > int(spec.get("backoffLimit", 6)):
            return "BackoffLimitExceeded"
        deadline = spec.get("activeDeadlineSeconds")
        start = status.get("startTime")
        if deadline is not None and start and datetime.now(UTC).timestamp() - _seconds(start) >= float(deadline):
            return "DeadlineExceeded"
        return ""

    def _deadline_wake(self, job: Obj) -> None:
        deadline, start = job["spec"].get("activeDeadlineSeconds"), job["status"].get("startTime")
        if deadline is not None and start and not _finished(job):
            self._later(_seconds(start) + float(deadline) - datetime.now(UTC).timestamp() + 0.5)

    async def _replace_pod(self, job: Obj) -> None:
        """manageJob: a pod for the Job, after the backoff of its failures in a row."""
        uid = job["metadata"]["uid"]
        failures = self.failed_in_a_row.get(uid, 0)
        if failures:
            backoff = min(MAX_POD_FAILURE_BACKOFF_S, POD_FAILURE_BACKOFF_S * 2 ** (failures - 1))
            left = self.last_failure[uid] + backoff - asyncio.get_running_loop().time()
            if left > 0:
                self._later(left)
                return
        template = copy.deepcopy(job["spec"]["template"])
        meta = job["metadata"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **template.get("metadata", {}),
                "generateName": f"{meta['name']}-",
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        target = self.rest.parse(f"/api/v1/namespaces/{meta['namespace']}/pods")
        assert target is not None
        await self.rest.create_object(target, pod)

    async def _expire(self, job: Obj) -> None:
        """The TTL-after-finished controller: a finished Job deleted its TTL after it finished (pods first)."""
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        finished = _finished(job)
        if ttl is None or finished is None:
            return
        left = _seconds(finished["lastTransitionTime"]) + float(ttl) - datetime.now(UTC).timestamp()
        if left > 0:
            self._later(left)
            return
        target = self.rest.parse(
            f"/apis/batch/v1/namespaces/{job['metadata']['namespace']}/jobs/{job['metadata']['name']}"
        )
        assert target is not None
        await self.rest.delete(target, {"propagationPolicy": "Foreground"})


def _ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
