"""The groups the double serves, and the discovery documents made from them.

A new group (``resource.k8s.io``, say) is a module with a ``GROUP`` added to ``GROUPS``.
"""

from __future__ import annotations

from typing import Any

from tests.kube import dra, kai
from tests.kube.api import apps, batch, core
from tests.kube.api.schema import Group, Resource

Obj = dict[str, Any]


def group_of(name: str, version: str, resources: dict[str, tuple[str, bool]]) -> Group:
    """A group whose resources are served as they are stored: {plural: (kind, namespaced)}."""
    return Group(name, version, tuple(Resource(p, kind, namespaced=ns) for p, (kind, ns) in resources.items()))


GROUPS: tuple[Group, ...] = (
    core.GROUP,
    apps.GROUP,
    batch.GROUP,
    group_of(dra.GROUP, dra.VERSION, dra.RESOURCES),  # resource.k8s.io: DRA (tests/kube/dra.py)
    group_of(kai.GROUP, kai.VERSION, kai.RESOURCES),  # scheduling.run.ai: KAI's queues (tests/kube/kai.py)
)


def group(name: str, version: str) -> Group | None:
    return next((g for g in GROUPS if g.name == name and g.version == version), None)


def api_versions(address: str) -> Obj:
    """``GET /api``."""
    cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr}


def _group_document(name: str) -> Obj:
    versions = [{"groupVersion": g.group_version, "version": g.version} for g in GROUPS if g.name == name]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> Obj:
    """``GET /apis``: every named group."""
    names = list(dict.fromkeys(g.name for g in GROUPS if g.name))
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_document(n) for n in names]}


def api_group(name: str) -> Obj | None:
    """``GET /apis/{group}``."""
    if not any(g.name == name for g in GROUPS if g.name):
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_document(name)}


def resource_list(served: Group) -> Obj:
    """``GET /api/v1`` or ``/apis/{group}/{version}``: the resources and their subresources."""
    resources: list[Obj] = []
    for resource in served.resources:
        entry = {
            "name": resource.plural,
            "singularName": resource.singular,
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": list(resource.verbs),
        }
        if resource.short_names:
            entry["shortNames"] = list(resource.short_names)
        resources.append(entry)
        for sub in resource.subresources:
            verbs = {"exec": ["create", "get"], "log": ["get"], "binding": ["create"], "eviction": ["create"]}
            resources.append(
                {
                    "name": f"{resource.plural}/{sub}",
                    "singularName": "",
                    "namespaced": resource.namespaced,
                    "kind": {"binding": "Binding", "eviction": "Eviction", "exec": "PodExecOptions", "log": "Pod"}.get(
                        sub, resource.kind
                    ),
                    "verbs": verbs.get(sub, ["get", "patch", "update"]),
                }
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": served.group_version, "resources": resources}
