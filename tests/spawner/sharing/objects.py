"""Kubernetes objects as the API returns them, for the backends' tests: a Node, a notebook Pod."""

from typing import Any


def node(name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": extra.pop("annotations", {})},
        "spec": extra.pop("spec", {}),
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", **allocatable},
            "conditions": extra.pop("conditions", [{"type": "Ready", "status": "True"}]),
        },
    }
    return obj


def pod(
    name: str,
    node_name: str,
    limits: dict[str, str],
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    user: str = "alice",
    **meta: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "jhub",
            "labels": {"component": "singleuser-server"},
            "annotations": {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": "", **(annotations or {})},
            **meta,
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "notebook", "resources": {"limits": limits, "requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
        },
        "status": {"phase": phase},
    }
