"""The core group (``/api/v1``): the resources KubeSpawner, the chart and generic clients use.

Defaults are those the API server fills in on create (pkg/apis/core/v1/defaults.go and the
registries' PrepareForCreate) for the fields a client reads back.
"""

from __future__ import annotations

import base64
import ipaddress
import random
from typing import Any

from tests.kube.api.schema import Group, Resource

Obj = dict[str, Any]
SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/16")  # kube-apiserver's default --service-cluster-ip-range


def pod_defaults(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    if "serviceAccountName" not in spec:
        spec["serviceAccountName"] = spec.get("serviceAccount") or "default"
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault(
        "tolerations",
        [
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for taint in ("not-ready", "unreachable")
        ],
    )
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        image = container.get("image", "")
        tag = image.rsplit("/", 1)[-1]
        latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")
    pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}


def _qos(spec: Obj) -> str:
    limits = [(c.get("resources") or {}).get("limits") or {} for c in spec.get("containers") or []]
    requests = [(c.get("resources") or {}).get("requests") or {} for c in spec.get("containers") or []]
    if not any(limits) and not any(requests):
        return "BestEffort"
    guaranteed = all(
        limit.get("cpu") and limit.get("memory") and all(ask.get(k, limit[k]) == limit[k] for k in ("cpu", "memory"))
        for limit, ask in zip(limits, requests, strict=True)
    )
    return "Guaranteed" if guaranteed else "Burstable"


def service_defaults(service: Obj) -> None:
    spec = service.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") != "None":
        # The allocator picks a free address of the range; a random one is free with overwhelming odds.
        address = str(SERVICE_RANGE[random.randrange(10, SERVICE_RANGE.num_addresses - 1)])
        spec["clusterIP"] = spec.get("clusterIP") or address
    spec.setdefault("clusterIPs", [spec["clusterIP"]])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    service["status"] = {"loadBalancer": {}}


def secret_defaults(secret: Obj) -> None:
    """type Opaque, and stringData written into data (base64), as the API server stores it."""
    secret.setdefault("type", "Opaque")
    data = secret.setdefault("data", {}) or {}
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data


def claim_defaults(claim: Obj) -> None:
    claim.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
    claim["status"] = {"phase": "Pending"}


def namespace_defaults(namespace: Obj) -> None:
    namespace.setdefault("spec", {})["finalizers"] = ["kubernetes"]
    labels = namespace["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = namespace["metadata"]["name"]
    namespace["status"] = {"phase": "Active"}


def node_defaults(node: Obj) -> None:
    node.setdefault("spec", {})
    node.setdefault("status", {})


POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
EVENT_FIELDS = tuple(
    [f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")]
    + ["reason", "reportingComponent", "source", "type"]
)

GROUP = Group(
    "",
    "v1",
    (
        Resource(
            "pods",
            "Pod",
            short_names=("po",),
            subresources=("status", "binding", "exec", "log", "eviction"),
            fields=POD_FIELDS,
            defaults=pod_defaults,
            returns_deleted=True,
        ),
        Resource(
            "services",
            "Service",
            short_names=("svc",),
            subresources=("status",),
            defaults=service_defaults,
            name_rule="label1035",
        ),
        Resource("endpoints", "Endpoints", short_names=("ep",)),
        Resource("configmaps", "ConfigMap", short_names=("cm",)),
        Resource("secrets", "Secret", fields=("type",), defaults=secret_defaults),
        Resource(
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            short_names=("pvc",),
            subresources=("status",),
            defaults=claim_defaults,
        ),
        Resource("serviceaccounts", "ServiceAccount", short_names=("sa",)),
        Resource("events", "Event", short_names=("ev",), fields=EVENT_FIELDS),
        Resource(
            "nodes",
            "Node",
            namespaced=False,
            short_names=("no",),
            subresources=("status",),
            fields=("spec.unschedulable",),
            defaults=node_defaults,
        ),
        Resource(
            "namespaces",
            "Namespace",
            namespaced=False,
            short_names=("ns",),
            subresources=("status", "finalize"),
            fields=("status.phase",),
            defaults=namespace_defaults,
            returns_deleted=True,
            name_rule="label",
        ),
    ),
)
