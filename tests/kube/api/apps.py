"""The apps group (``/apis/apps/v1``): stored and served as the API server serves them.

No controller runs: a Deployment's or DaemonSet's pods are not made here (the chart's
workloads run as containers in tests/kube/containers.py instead).
"""

from __future__ import annotations

from typing import Any

from tests.kube.api.schema import Group, Resource

Obj = dict[str, Any]


def workload_defaults(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("revisionHistoryLimit", 10)
    if obj["kind"] in ("Deployment", "ReplicaSet", "StatefulSet"):
        spec.setdefault("replicas", 1)
    if obj["kind"] == "Deployment":
        rolling = {"maxSurge": "25%", "maxUnavailable": "25%"}
        spec.setdefault("strategy", {"type": "RollingUpdate", "rollingUpdate": rolling})
        spec.setdefault("progressDeadlineSeconds", 600)
    if obj["kind"] == "DaemonSet":
        rolling = {"maxSurge": 0, "maxUnavailable": 1}
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": rolling})
    obj["metadata"]["generation"] = 1
    obj["status"] = {}


def _workload(plural: str, kind: str, short: str) -> Resource:
    return Resource(plural, kind, short_names=(short,), subresources=("status",), defaults=workload_defaults)


GROUP = Group(
    "apps",
    "v1",
    (
        _workload("deployments", "Deployment", "deploy"),
        _workload("daemonsets", "DaemonSet", "ds"),
        _workload("replicasets", "ReplicaSet", "rs"),
        _workload("statefulsets", "StatefulSet", "sts"),
    ),
)
