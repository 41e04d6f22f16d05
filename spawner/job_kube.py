"""Kubernetes: a job is a ``batch/v1`` Job, made when the GPU line places it, read back from its conditions.

``job_manifest`` builds the Job (pure, from plain values, as KubeSpawner's ``make_pod``): one pod
that never restarts in place (``restartPolicy: Never``), its retries the Job controller's
(``backoffLimit``: the job's retries), its time limit the Job's ``activeDeadlineSeconds``, kept
``ttlSecondsAfterFinished`` after it ends; the pod carries the sharing backend's resources,
annotations, labels and environment (spawner/sharing/, as a notebook pod does), the GPU scheduler's
name, the names the inventory reads its owner by (so the line counts it as ``user/job:ID``), the
class charged, and a termination grace period that is the job's checkpoint time: deleting the Job
(a cancel, a preemption) gives its pod SIGTERM, that long, then SIGKILL.

``observed`` reads a Job and its pods into what the ledger records: running, or ended and how
(the Complete and Failed conditions the Job controller writes, their reasons, the last pod's
exit code and termination reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spawner.inventory import GROUP_ANNOTATION, SERVERNAME, USERNAME
from spawner.jobs import FAILED, RUNNING, STARTING, SUCCEEDED, TIME_LIMIT, job_server
from spawner.sharing.base import ServerGpuSpec

Obj = dict[str, Any]
JOB_LABEL = "gpuslice.io/job"  # the job's id, on the Job and its pod
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuslice", "app.kubernetes.io/component": "batch-job"}
MEMORY_ANNOTATION = "gpuslice.io/gpu-memory-bytes"  # what the class is charged (spawner/kube.py usage_from_pods)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the Job controller's label on its pods


def job_name(job_id: int, attempt: int) -> str:
    """The Job's name for one placement of a job (a preempted job placed again gets a new Job)."""
    return f"gpuslice-job-{job_id}-{attempt}"


def _label_value(text: str) -> str:
    """A label value from a user name (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("-_.")
    return cleaned or "x"


@dataclass(frozen=True)
class JobPod:
    """What every job's pod on this cluster shares (the chart's settings)."""

    namespace: str
    scheduler_name: str = ""  # for pods holding a GPU, where the backend names none
    uid: int = 1000
    grace_s: float = 30.0
    ttl_s: int = 86400
    models_volume: Obj | None = None  # the model market's files (a volume source)
    home_claim: str = ""  # a claim name template ("claim-{username}"): the user's home; "" none


def job_manifest(
    *,
    name: str,
    job_id: int,
    user: str,
    group: str | None,
    asked_bytes: int,
    image: str,
    command: list[str],
    env: dict[str, str],
    gpu: ServerGpuSpec,
    holds_gpu: bool,
    retries: int,
    time_limit_s: float,
    cpus: float | None,
    memory_bytes: int | None,
    models: dict[str, str],
    pod: JobPod,
) -> Obj:
    """The batch/v1 Job for one placement of a job (see the module's docstring). Inputs are not changed."""
    limits = dict(gpu.limits)
    if cpus:
        limits["cpu"] = f"{int(cpus * 1000)}m"
    if memory_bytes:
        limits["memory"] = str(memory_bytes)
    annotations = {
        **gpu.annotations,
        USERNAME: user,
        SERVERNAME: job_server(job_id),
        MEMORY_ANNOTATION: str(asked_bytes),
        **({GROUP_ANNOTATION: group} if group else {}),
    }
    labels = {**gpu.labels, **MANAGED_BY, JOB_LABEL: str(job_id), USERNAME: _label_value(user)}
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    if models and pod.models_volume:
        volumes.append({"name": "gpuslice-models", **pod.models_volume})
        mounts += [
            {"name": "gpuslice-models", "mountPath": f"/models/{slug}", "subPath": path, "readOnly": True}
            for slug, path in models.items()
        ]
    if pod.home_claim:
        claim = pod.home_claim.format(username=_label_value(user))
        volumes.append({"name": "home", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "home", "mountPath": "/home/jovyan"})
    container: Obj = {
        "name": "job",
        "image": image,
        "command": list(command),
        "workingDir": "/home/jovyan",
        "env": [{"name": k, "value": v} for k, v in {**env, **gpu.env}.items()],
        "resources": {"limits": limits} if limits else {},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
        **({"volumeMounts": mounts} if mounts else {}),
    }
    spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(pod.grace_s),
        "securityContext": {
            "runAsUser": pod.uid,
            "runAsGroup": pod.uid,
            "fsGroup": pod.uid,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,  # a job has no business with the cluster's API
        "containers": [container],
        **({"volumes": volumes} if volumes else {}),
    }
    scheduler = gpu.scheduler_name or pod.scheduler_name
    if holds_gpu and scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": pod.namespace, "labels": dict(labels)},
        "spec": {
            "backoffLimit": retries,
            "activeDeadlineSeconds": max(1, int(time_limit_s)),
            "ttlSecondsAfterFinished": pod.ttl_s,
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec},
        },
    }


@dataclass(frozen=True)
class Observed:
    """A Job as the ledger records it: its state, and once ended the exit code and why."""

    state: str  # STARTING, RUNNING, SUCCEEDED or FAILED
    exit_code: int | None = None
    stop_kind: str = ""  # TIME_LIMIT when the deadline ended it
    reason: str = ""  # the controller's or the kubelet's words, when it failed
    failures: int = 0  # pods that failed (the retries used)
    pod: str = ""  # its newest pod (for its log)


def _condition(job: Obj, kind: str) -> Obj | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def _terminated(pod: Obj) -> Obj:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if ended:
            return dict(ended)
    return {}


def observed(job: Obj, pods: list[Obj]) -> Observed:
    """What a Job says now (see the module's docstring); ``pods``: the Job's pods, any order."""
    status = job.get("status") or {}
    newest = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)
    pod_name = newest["metadata"]["name"] if newest else ""
    failures = int(status.get("failed") or 0)
    ended = _terminated(newest) if newest else {}
    code = ended.get("exitCode")
    if _condition(job, "Complete"):
        return Observed(SUCCEEDED, 0, failures=failures, pod=pod_name)
    failed = _condition(job, "Failed")
    if failed:
        if failed.get("reason") == "DeadlineExceeded":
            return Observed(FAILED, code, TIME_LIMIT, failed.get("message", ""), failures, pod_name)
        why = ended.get("reason") or failed.get("message") or failed.get("reason") or ""
        return Observed(FAILED, code if code is not None else 1, "", str(why), failures, pod_name)
    phase = (newest.get("status") or {}).get("phase") if newest else None
    if phase == "Running" and int(status.get("active") or 0):
        return Observed(RUNNING, failures=failures, pod=pod_name)
    return Observed(STARTING, failures=failures, pod=pod_name)
