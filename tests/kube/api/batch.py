"""The batch group (``/apis/batch/v1``): Jobs and CronJobs, stored and served; Jobs run their pods through the
double's Job controller (tests/kube/job_controller.py); no CronJob controller runs."""

from __future__ import annotations

import uuid
from typing import Any

from tests.kube.api.schema import Group, Resource

Obj = dict[str, Any]


def job_defaults(job: Obj) -> None:
    """The job strategy's defaults, and the selector it generates (controller-uid) unless manualSelector."""
    spec = job.setdefault("spec", {})
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    meta = job["metadata"]
    meta.setdefault("uid", str(uuid.uuid4()))
    if not spec.get("manualSelector"):
        generated = {"batch.kubernetes.io/controller-uid": meta["uid"]}
        spec["selector"] = {"matchLabels": generated}
        labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        labels.update(
            {
                **generated,
                "controller-uid": meta["uid"],
                "batch.kubernetes.io/job-name": meta["name"],
                "job-name": meta["name"],
            }
        )
    meta["generation"] = 1
    job["status"] = {}


def cronjob_defaults(cronjob: Obj) -> None:
    spec = cronjob.setdefault("spec", {})
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    spec.setdefault("successfulJobsHistoryLimit", 3)
    spec.setdefault("failedJobsHistoryLimit", 1)
    cronjob["metadata"]["generation"] = 1
    cronjob["status"] = {}


GROUP = Group(
    "batch",
    "v1",
    (
        Resource("jobs", "Job", subresources=("status",), defaults=job_defaults),
        Resource("cronjobs", "CronJob", short_names=("cj",), subresources=("status",), defaults=cronjob_defaults),
    ),
)
