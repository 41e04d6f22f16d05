"""A Kubernetes API test double, served over HTTP, with a fake scheduler and kubelet.

It serves the parts of the core/v1 API that KubeSpawner and gpuslice use, with the real
API's JSON shapes and watch protocol: namespaced pods (create, get, list, watch, delete),
events (list, watch), services, secrets and PVCs (create, get, delete), and nodes (list,
watch). Lists carry ``metadata.resourceVersion``; ``?watch=1&resourceVersion=N`` streams
``{"type": ADDED|MODIFIED|DELETED, "object": ...}`` lines after N, and an expired N gets
``410 Gone`` (an ERROR event) as the real API server does.

The scheduler places a pod on a node with enough of every extended resource it asks for
(``aliyun.com/gpu-mem``, ``nvidia.com/gpu``, ...) or leaves it Pending with a
``FailedScheduling`` event worded as kube-scheduler words it. The kubelet runs the pod's
first container command as a local process bound to the pod's own loopback address
(127.A.B.N, A.B from the double's process id: ``pod_addresses``), with the pod's
environment, and reports it Running and Ready with that IP.

A pod whose ``spec.schedulerName`` is the configured extender scheduler's (``--extender URL``)
and that asks for one of the extender's managed resources is scheduled as kube-scheduler
schedules with an extender that binds: the nodes that fit its extended resources (less
those the extender manages with ``ignoredByScheduler``) go to the extender's ``filter``
(as ``NodeNames``: the extender is ``nodeCacheCapable``), the survivors to ``prioritize``,
the highest score (first of ties) to ``bind``, and the extender binds through
``pods/{name}/binding`` after patching the pod's annotations (``PATCH`` with a merge or
strategic-merge patch).

With ``--rbac FILE`` it authenticates and authorizes as the real API server does with RBAC:
the bearer token names a user (``system:serviceaccount:<namespace>:<name>``), and a request
is allowed only when a Role (through a RoleBinding in the request's namespace) or a
ClusterRole (through a ClusterRoleBinding) grants its verb on its resource; otherwise 401
or 403 with the API server's wording. FILE: ``{"tokens": {token: user}, "objects": [Role,
ClusterRole, RoleBinding, ClusterRoleBinding ...]}``, e.g. a Helm chart's rendered RBAC.
With ``--schedulers a,b`` only pods whose ``schedulerName`` (default ``default-scheduler``)
is one of those are scheduled; a pod naming a scheduler that does not run stays Pending with
no event, as in a real cluster.

Run: ``python -m tests.kube.apiserver --port P --nodes nodes.json`` (nodes: Node objects).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.kube.apiserver_groups import GroupsMixin
from tests.kube.kubelet import ContainerFailedError, PodmanKubelet

Obj = dict[str, Any]
KINDS = {
    "pods": "Pod",
    "events": "Event",
    "services": "Service",
    "secrets": "Secret",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "nodes": "Node",
}
GPUSHARE_MEM, GPUSHARE_COUNT, GPUSHARE_IDX = "aliyun.com/gpu-mem", "aliyun.com/gpu-count", "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD, GPUSHARE_ASSIGNED = "ALIYUN_COM_GPU_MEM_POD", "ALIYUN_COM_GPU_MEM_ASSIGNED"
GPUSHARE_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
MANAGED = {
    "aliyun.com/gpu-mem": False,
    "nvidia.com/gpu": False,
    "nvidia.com/gpumem": True,
    "nvidia.com/gpumem-percentage": True,
    "nvidia.com/gpucores": True,
}
HISTORY = 1000  # watch events kept; older resourceVersions are Gone


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def rbac_allows(objects: list[Obj], user: str, verb: str, resource: str, namespace: str) -> bool:
    """Whether RBAC objects grant user the verb on a core ("" group) resource; namespace "" is cluster scope."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        bound_in = binding["metadata"].get("namespace", "")
        if binding["kind"] == "RoleBinding" and bound_in != namespace:
            continue  # a RoleBinding grants only in its own namespace
        if not any(_is_subject(subject, user, bound_in) for subject in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], bound_in if ref["kind"] == "Role" else "", ref["name"]))
        for rule in (role or {}).get("rules") or []:
            if (
                _has(rule.get("apiGroups"), "")
                and _has(rule.get("resources"), resource)
                and _has(rule.get("verbs"), verb)
            ):
                return True
    return False


def _is_subject(subject: Obj, user: str, binding_namespace: str) -> bool:
    if subject.get("kind") == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user == f"system:serviceaccount:{namespace}:{subject['name']}"
    return subject.get("kind") == "User" and subject.get("name") == user


def _has(values: list[str] | None, wanted: str) -> bool:
    return values is not None and (wanted in values or "*" in values)


def request_verb(method: str, has_name: bool, watch: bool) -> str:
    if method == "GET":
        return "get" if has_name else "watch" if watch else "list"
    return {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def matches_labels(obj: Obj, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, value = term.split("=", 1)
        current: Any = obj
        for part in key.rstrip("=").split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if str(current) != value.lstrip("="):
            return False
    return True


def pod_addresses(pid: int) -> Iterator[str]:
    """Loopback addresses for one API double's pods, apart from every other double's.

    Each pod's server listens on its own address at the image's port (8888): two doubles
    running at once (pytest's workers) that both counted from 127.0.0.2 gave their first pods
    the same address, and the second server could not bind ("port 8888 is already in use").
    Each double counts in a /24 named by its process id's low 16 bits: two doubles running at
    once differ there unless their ids are 65,536 apart. 253 pods a double, more than any test
    starts.
    """
    high, low = (pid >> 8) & 0xFF, pid & 0xFF
    return (f"127.{high}.{low}.{n}" for n in range(2, 255))


class Store:
    """Objects by (resource, namespace, name), one resourceVersion counter, a watch log."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.version = itertools.count(1)
        self.current = 0
        self.log: list[tuple[int, str, str, str, Obj]] = []  # (rv, resource, namespace, type, object)
        self.changed = asyncio.Condition()
        # injected: {"method", "path_contains", "query_contains"?, "status" (HTTP code, "timeout",
        # "slow" with "delay_s", or "gone": a 410 ERROR event on a watch), "times"}
        self.faults: list[dict[str, Any]] = []

    async def put(self, resource: str, namespace: str, obj: Obj, kind: str) -> Obj:
        meta = obj.setdefault("metadata", {})
        self.current = next(self.version)
        meta["resourceVersion"] = str(self.current)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        if namespace:
            meta["namespace"] = namespace
        self.objects[(resource, namespace, meta["name"])] = obj
        await self._emit(resource, namespace, kind, obj)
        return obj

    async def delete(self, resource: str, namespace: str, name: str) -> Obj | None:
        obj = self.objects.pop((resource, namespace, name), None)
        if obj is not None:
            self.current = next(self.version)
            obj["metadata"]["resourceVersion"] = str(self.current)
            await self._emit(resource, namespace, "DELETED", obj)
        return obj

    async def _emit(self, resource: str, namespace: str, kind: str, obj: Obj) -> None:
        self.log.append((self.current, resource, namespace, kind, json.loads(json.dumps(obj))))
        del self.log[:-HISTORY]
        async with self.changed:
            self.changed.notify_all()

    def items(self, resource: str, namespace: str | None) -> list[Obj]:
        return [o for (r, ns, _), o in self.objects.items() if r == resource and (namespace is None or ns == namespace)]


class ApiServer(GroupsMixin):
    def __init__(
        self,
        nodes: list[Obj],
        kubelet: bool = True,
        extender: str | None = None,
        scheduler_name: str = "gpuslice-scheduler",
        managed: dict[str, bool] | None = None,
        rbac: Obj | None = None,
        schedulers: frozenset[str] | None = None,
        podman_network: str = "",
    ) -> None:
        self.extender = extender
        # The extender's managedResources: resource -> ignoredByScheduler. As in kube-scheduler,
        # the extender is asked only about pods that ask for one of them, and the scheduler's
        # own fit check skips the ignored ones (HAMi's memory and cores are no node resources).
        self.managed = MANAGED if managed is None else managed
        self.scheduler_name = scheduler_name
        self.store = Store()
        self.initial_nodes = nodes
        self.kubelet = kubelet
        self.rbac = rbac
        self.schedulers = schedulers or frozenset({"default-scheduler"})
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.addresses = pod_addresses(os.getpid())
        # With a podman network, the kubelet runs each pod as a container of its image there.
        self.podman = PodmanKubelet(podman_network) if podman_network else None

    # -- routing ------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.authorize, self.faults])
        app.on_startup.append(self._load_nodes)
        app.on_cleanup.append(self._stop_all)
        app.router.add_get("/version", self.version)
        app.router.add_get("/api/v1/nodes", self.list_or_watch)
        app.router.add_get("/api/v1/pods", self.list_all_pods)
        app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{name}", self.patch_pod)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", self.bind)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}", self.list_or_watch)
        app.router.add_post("/api/v1/namespaces/{namespace}/{resource}", self.create)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}/{name}", self.read)
        app.router.add_delete("/api/v1/namespaces/{namespace}/{resource}/{name}", self.remove)
        self.add_group_routes(app)  # resource.k8s.io and KAI's scheduling.run.ai (tests/kube/apiserver_groups.py)
        app.router.add_post("/_test/faults", self.add_fault)
        app.router.add_get("/_test/faults", self.list_faults)
        app.router.add_post("/_test/evict/{namespace}/{name}", self.evict)
        return app

    @web.middleware
    async def faults(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        for fault in self.store.faults:
            if fault["times"] > 0 and self._matches(fault, request):
                fault["times"] -= 1
                if fault["status"] == "timeout":
                    await asyncio.sleep(3600)
                if fault["status"] == "slow":  # a slow but correct answer
                    await asyncio.sleep(float(fault["delay_s"]))
                    break
                if fault["status"] == "gone":  # a watch whose resourceVersion was compacted away
                    return await self._gone(request, "too old resource version (injected)")
                return status(int(fault["status"]), "InternalError", "injected fault")
        return await handler(request)

    @web.middleware
    async def authorize(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        """RBAC as the API server applies it (only with --rbac; the test hooks under /_test are open)."""
        if self.rbac is None or request.path == "/version" or request.path.startswith("/_test/"):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = self.rbac["tokens"].get(token) if scheme == "Bearer" else None
        if user is None:
            return status(401, "Unauthorized", "Unauthorized")
        parts = request.path.strip("/").split("/")  # api v1 [namespaces ns] resource [name]
        namespace = parts[3] if len(parts) > 3 and parts[2] == "namespaces" else ""
        rest = parts[4:] if namespace else parts[2:]
        resource, has_name = rest[0], len(rest) > 1
        verb = request_verb(request.method, has_name, request.query.get("watch") in ("1", "true", "True"))
        if not rbac_allows(self.rbac["objects"], user, verb, resource, namespace):
            where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            return status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "" {where}',
            )
        return await handler(request)

    @staticmethod
    def _matches(fault: dict[str, Any], request: web.Request) -> bool:
        return (
            request.method == fault["method"]
            and fault["path_contains"] in request.path
            and fault.get("query_contains", "") in request.query_string
        )

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0-gpuslice-double"})

    async def _load_nodes(self, app: web.Application) -> None:
        for node in self.initial_nodes:
            await self.store.put("nodes", "", node, "ADDED")

    # -- list and watch -----------------------------------------------------------------

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        resource = request.match_info.get("resource", "nodes")
        if resource not in KINDS:
            return status(404, "NotFound", f"the server could not find the requested resource ({resource})")
        namespace = request.match_info.get("namespace", "") if resource != "nodes" else ""
        labels = request.query.get("labelSelector", "")
        fields = request.query.get("fieldSelector", "")

        def wanted(obj: Obj) -> bool:
            return matches_labels(obj, labels) and matches_fields(obj, fields)

        if request.query.get("watch") in ("1", "true", "True"):
            return await self._watch(request, resource, namespace, wanted)
        items = [o for o in self.store.items(resource, namespace if resource != "nodes" else None) if wanted(o)]
        return web.json_response(
            {
                "kind": f"{KINDS[resource]}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.store.current)},
                "items": items,
            }
        )

    async def list_all_pods(self, request: web.Request) -> web.Response:
        items = self.store.items("pods", None)
        meta = {"resourceVersion": str(self.store.current)}
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})

    async def patch_pod(self, request: web.Request) -> web.Response:
        """Merge and strategic-merge patches of a pod's labels and annotations (maps merge, null deletes)."""
        if request.content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {request.content_type}"
            )
        pod = self.store.objects.get(("pods", request.match_info["namespace"], request.match_info["name"]))
        if pod is None:
            return status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        patch = await request.json()
        for field in ("annotations", "labels"):
            for key, value in ((patch.get("metadata") or {}).get(field) or {}).items():
                target = pod["metadata"].setdefault(field, {})
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        return web.json_response(pod)

    async def bind(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        body = await request.json()
        node = (body.get("target") or {}).get("name", "")
        if pod["spec"].get("nodeName"):
            return status(409, "Conflict", f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        if ("nodes", "", node) not in self.store.objects:
            return status(404, "NotFound", f'nodes "{node}" not found')
        await self._place(pod, node)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201)

    async def _place(self, pod: Obj, node: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        pod["spec"]["nodeName"] = node
        await self.store.put("pods", namespace, pod, "MODIFIED")
        await self._event(pod, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}")
        if self.kubelet:
            await self._run(pod)

    async def _watch(
        self, request: web.Request, resource: str, namespace: str, wanted: Callable[[Obj], bool]
    ) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.store.current)
        oldest = self.store.log[0][0] if self.store.log else self.store.current + 1
        if since and since < oldest - 1:
            return await self._gone(request, f"too old resource version: {since} ({oldest - 1})")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        deadline = asyncio.get_running_loop().time() + float(request.query.get("timeoutSeconds") or 300)
        sent = since
        while asyncio.get_running_loop().time() < deadline:
            for rv, res, ns, kind, obj in list(self.store.log):
                if rv > sent and res == resource and (resource == "nodes" or ns == namespace) and wanted(obj):
                    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            sent = self.store.current
            async with self.store.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.store.changed.wait(), timeout=1)
        return response

    @staticmethod
    async def _gone(request: web.Request, message: str) -> web.StreamResponse:
        """A watch the API server cannot serve from its history: one ERROR event, 410 Expired."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
        await response.write(json.dumps({"type": "ERROR", "object": {**gone, "message": message}}).encode() + b"\n")
        return response

    # -- create, read, delete -----------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        resource, namespace = request.match_info["resource"], request.match_info["namespace"]
        if resource not in KINDS or resource == "nodes":
            return status(404, "NotFound", f"the server could not find the requested resource ({resource})")
        obj = await request.json()
        name = obj.get("metadata", {}).get("name")
        if not name:
            return status(422, "Invalid", f"{KINDS[resource]} is invalid: metadata.name: Required value")
        if (resource, namespace, name) in self.store.objects:
            return status(409, "AlreadyExists", f'{resource} "{name}" already exists')
        obj.setdefault("kind", KINDS[resource])
        obj.setdefault("apiVersion", "v1")
        if resource == "pods":
            obj["status"] = {"phase": "Pending", "conditions": []}
        await self.store.put(resource, namespace, obj, "ADDED")
        if resource == "pods":
            asyncio.get_running_loop().create_task(self._schedule(namespace, name))
        return web.json_response(obj, status=201)

    async def read(self, request: web.Request) -> web.Response:
        key = (request.match_info["resource"], request.match_info["namespace"], request.match_info["name"])
        obj = self.store.objects.get(key)
        if obj is None:
            return status(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        return web.json_response(obj)

    async def remove(self, request: web.Request) -> web.Response:
        resource, namespace, name = (request.match_info[k] for k in ("resource", "namespace", "name"))
        obj = self.store.objects.get((resource, namespace, name))
        if obj is None:
            return status(404, "NotFound", f'{resource} "{name}" not found')
        if resource == "pods":
            self._kill(namespace, name)
            await self.forget_claims(obj)
        await self.store.delete(resource, namespace, name)
        return web.json_response(obj)

    # -- scheduler and kubelet ----------------------------------------------------------

    def _free(self, node: Obj) -> dict[str, int]:
        free = {k: _quantity(v) for k, v in (node.get("status", {}).get("allocatable") or {}).items()}
        for pod in self.store.items("pods", None):
            if pod["spec"].get("nodeName") == node["metadata"]["name"]:
                for resource, amount in _limits(pod).items():
                    free[resource] = free.get(resource, 0) - amount
        return free

    def _runs(self, scheduler: str) -> bool:
        """Whether a scheduler of that name runs: a named one, or the extender's when it has one."""
        return scheduler in self.schedulers or (self.extender is not None and scheduler == self.scheduler_name)

    async def _schedule(self, namespace: str, name: str) -> None:
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None or not self._runs(pod["spec"].get("schedulerName") or "default-scheduler"):
            return  # no scheduler of that name runs: the pod waits, and nothing says why
        asked = {k: v for k, v in _limits(pod).items() if "/" in k}  # extended resources decide here
        nodes = self.store.items("nodes", None)
        if await self.schedule_in_groups(pod, nodes):  # DRA claims, KAI's pods
            return
        interested = not self.managed or any(r in self.managed for r in asked)
        if self.extender and pod["spec"].get("schedulerName") == self.scheduler_name and interested:
            checked = {r: a for r, a in asked.items() if not self.managed.get(r)}
            fit = [
                n["metadata"]["name"] for n in nodes if all(self._free(n).get(r, 0) >= a for r, a in checked.items())
            ]
            await self._schedule_with_extender(pod, fit, len(nodes))
            return
        short: dict[str, int] = defaultdict(int)
        for node in nodes:
            free = self._free(node)
            lacking = [r for r, amount in asked.items() if free.get(r, 0) < amount]
            card = self._gpushare_card(node, asked.get(GPUSHARE_MEM, 0)) if not lacking else None
            if card == -1:
                lacking = [GPUSHARE_MEM]  # room on the node, but not on any one card
            if not lacking:
                if card is not None:
                    pod["metadata"].setdefault("annotations", {}).update(self._gpushare_annotations(node, card, asked))
                await self._place(pod, node["metadata"]["name"])
                return
            for resource in lacking:
                short[resource] += 1
        parts = ", ".join(f"{n} Insufficient {r}" for r, n in sorted(short.items()))
        await self._unschedulable(pod, len(nodes), parts)

    async def _unschedulable(self, pod: Obj, total: int, parts: str) -> None:
        message = (
            f"0/{total} nodes are available: {parts}. preemption: 0/{total} nodes are available: "
            f"{total} No preemption victims found for incoming pod."
        )
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now(),
            }
        ]
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        await self._event(pod, "Warning", "FailedScheduling", message)

    async def _schedule_with_extender(self, pod: Obj, names: list[str], total: int) -> None:
        """kube-scheduler with an extender (filterVerb, prioritizeVerb, bindVerb; nodeCacheCapable)."""
        async with aiohttp.ClientSession() as session:

            async def call(verb: str, body: Obj) -> Any:
                async with session.post(f"{self.extender}/{verb}", json=body) as response:
                    response.raise_for_status()
                    return await response.json()

            meta = pod["metadata"]
            filtered = await call("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
            if filtered.get("Error"):
                await self._unschedulable(pod, total, f"extender: {filtered['Error']}")
                return
            kept = list(filtered.get("NodeNames") or [])
            if not kept:
                failed = filtered.get("FailedNodes") or {}
                await self._unschedulable(pod, total, ", ".join(f"{n}: {m}" for n, m in sorted(failed.items())))
                return
            scores = await call("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": kept})
            by_host = {s["Host"]: s["Score"] for s in scores}
            best = max(kept, key=lambda n: by_host.get(n, 0))  # max() keeps the first of ties
            args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
            answer = await call("bind", args)
        if answer.get("Error"):
            await self._event(pod, "Warning", "FailedScheduling", f"Binding rejected: {answer['Error']}")

    def _gpushare_card(self, node: Obj, units: int) -> int | None:
        """What gpushare's scheduler extender does (-1: no card has room; None: not gpushare).

        As its pkg/cache: cards are capacity/count units each; a card's use is the
        ALIYUN_COM_GPU_MEM_POD of its bound pods that are not complete (deleting,
        Succeeded or Failed); the pod goes to the card with the least room that fits.
        """
        per_card, cards = _gpushare_cards(node)
        if not units or not cards:
            return None
        used = [0] * cards
        for other in self.store.items("pods", None):
            annotations = other["metadata"].get("annotations") or {}
            if other["spec"].get("nodeName") != node["metadata"]["name"] or _gpushare_complete(other):
                continue
            index = _atoi(annotations.get(GPUSHARE_IDX, ""), -1)
            if 0 <= index < cards and _limits(other).get(GPUSHARE_MEM, 0) > 0:
                used[index] += max(0, _atoi(annotations.get(GPUSHARE_POD, ""), 0))
        fitting = [i for i in range(cards) if per_card - used[i] >= units]
        return min(fitting, key=lambda i: (per_card - used[i], i)) if fitting else -1

    @staticmethod
    def _gpushare_annotations(node: Obj, card: int, asked: dict[str, int]) -> dict[str, str]:
        """utils.PatchPodAnnotationSpec's annotations, written before the extender binds."""
        per_card, _ = _gpushare_cards(node)
        return {
            GPUSHARE_IDX: str(card),
            GPUSHARE_POD: str(asked[GPUSHARE_MEM]),
            "ALIYUN_COM_GPU_MEM_DEV": str(per_card),
            GPUSHARE_ASSIGNED: "false",
            GPUSHARE_ASSUME_TIME: str(time.time_ns()),
        }

    @staticmethod
    def _gpushare_assign(pod: Obj) -> None:
        """The device plugin's Allocate: the container starts, the pod is marked assigned."""
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(GPUSHARE_ASSIGNED) == "false":
            annotations.update({GPUSHARE_ASSIGNED: "true", GPUSHARE_ASSUME_TIME: str(time.time_ns())})

    async def _run(self, pod: Obj) -> None:
        self._gpushare_assign(pod)
        if self.podman is not None:
            return await self._run_container(pod)
        container = pod["spec"]["containers"][0]
        address = next(self.addresses)
        env = dict(os.environ)
        env.update({e["name"]: e.get("value", "") for e in container.get("env") or []})
        port = int((container.get("ports") or [{"containerPort": 8888}])[0]["containerPort"])
        env["JUPYTERHUB_SERVICE_URL"] = f"http://{address}:{port}{env.get('JUPYTERHUB_SERVICE_PREFIX', '/')}"
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        command = [
            str(Path(sys.executable).with_name(command[0])) if not os.path.isabs(command[0]) else command[0],
            *(a for a in command[1:] if not a.startswith("--ip")),
            f"--ip={address}",
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")  # a real image runs as uid 1000; the double runs as the test's user
        workdir = Path(env.get("GPUSLICE_DOUBLE_ROOT", "/tmp")) / pod["metadata"]["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        log = (workdir / "container.log").open("ab")
        self.processes[key] = subprocess.Popen(
            command, env=env, cwd=workdir, stdout=log, stderr=log, start_new_session=True
        )
        await self._running(pod, address)
        asyncio.get_running_loop().create_task(self._watch_container(key, self.processes[key]))

    async def _run_container(self, pod: Obj) -> None:
        """The pod as a podman container of its image (the image must exist on this machine)."""
        assert self.podman is not None
        try:
            address = await asyncio.to_thread(self.podman.start, pod)
        except ContainerFailedError as exc:
            pod["status"].update(phase="Failed", reason="ErrImagePull" if exc.image else "Error", message=str(exc))
            await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
            await self._event(pod, "Warning", "Failed", str(exc))
            return
        await self._running(pod, address)
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        asyncio.get_running_loop().create_task(self._watch_podman(key))

    async def _running(self, pod: Obj, address: str) -> None:
        container = pod["spec"]["containers"][0]
        pod["status"] = {
            "phase": "Running",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "hostIP": "127.0.0.1",
            "startTime": now(),
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now()}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "ready": True,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "started": True,
                    "state": {"running": {"startedAt": now()}},
                }
            ],
        }
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        await self._event(pod, "Normal", "Started", f"Started container {container['name']}")

    async def _watch_container(self, key: str, process: subprocess.Popen[bytes]) -> None:
        """A container that exits on its own leaves its pod Failed (restartPolicy Never, as KubeSpawner sets)."""
        while process.poll() is None:
            await asyncio.sleep(0.5)
        namespace, name = key.split("/", 1)
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None or self.processes.get(key) is not process:
            return  # deleted, or replaced
        status = pod["status"]
        status["phase"] = "Failed" if process.returncode else "Succeeded"
        status["containerStatuses"][0].update(
            ready=False, state={"terminated": {"exitCode": process.returncode, "finishedAt": now()}}
        )
        await self.store.put("pods", namespace, pod, "MODIFIED")

    async def _watch_podman(self, key: str) -> None:
        """A notebook container that exits leaves its pod Failed (or Succeeded), as a process does."""
        assert self.podman is not None
        namespace, name = key.split("/", 1)
        while (code := await asyncio.to_thread(self.podman.exit_code, namespace, name)) is None:
            await asyncio.sleep(1)
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None or code < 0:
            return  # deleted
        pod["status"]["phase"] = "Failed" if code else "Succeeded"
        pod["status"]["containerStatuses"][0].update(
            ready=False, state={"terminated": {"exitCode": code, "finishedAt": now()}}
        )
        await self.store.put("pods", namespace, pod, "MODIFIED")

    def _kill(self, namespace: str, name: str) -> None:
        if self.podman is not None:
            self.podman.remove(namespace, name)
        process = self.processes.pop(f"{namespace}/{name}", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    async def evict(self, request: web.Request) -> web.Response:
        """What an eviction does: the container is killed, the pod Failed with reason Evicted."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        self._kill(namespace, name)
        pod["status"].update(
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        )
        for container in pod["status"].get("containerStatuses") or []:
            container.update(
                ready=False, state={"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now()}}
            )
        await self.store.put("pods", namespace, pod, "MODIFIED")
        await self._event(pod, "Warning", "Evicted", "The node was low on resource: memory.")
        return web.json_response(pod)

    async def list_faults(self, request: web.Request) -> web.Response:
        """The injected faults with the times each has left (0: all used)."""
        return web.json_response(self.store.faults)

    async def add_fault(self, request: web.Request) -> web.Response:
        self.store.faults.append(await request.json())
        return web.json_response({"ok": True})

    async def _event(self, pod: Obj, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        name = f"{meta['name']}.{uuid.uuid4().hex[:12]}"
        event = {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "count": 1,
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "eventTime": None,
            "source": {"component": "default-scheduler" if reason == "FailedScheduling" else "kubelet"},
        }
        await self.store.put("events", meta["namespace"], event, "ADDED")

    async def _stop_all(self, app: web.Application) -> None:
        for key in list(self.processes):
            self._kill(*key.split("/", 1))
        for pod in self.store.items("pods", None) if self.podman else []:
            self._kill(pod["metadata"]["namespace"], pod["metadata"]["name"])


def _limits(pod: Obj) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for container in pod.get("spec", {}).get("containers") or []:
        for resource, value in ((container.get("resources") or {}).get("limits") or {}).items():
            total[resource] += _quantity(value)
    return total


def _gpushare_cards(node: Obj) -> tuple[int, int]:
    """(units per card, cards) as the extender reads them: from capacity (pkg/utils/node.go)."""
    status = node.get("status", {})
    capacity = status.get("capacity") or status.get("allocatable") or {}
    cards = int(capacity.get(GPUSHARE_COUNT, 0) or 0)
    return (int(capacity.get(GPUSHARE_MEM, 0) or 0) // cards if cards else 0), cards


def _gpushare_complete(pod: Obj) -> bool:
    """gpushare's utils.IsCompletePod."""
    return bool(pod["metadata"].get("deletionTimestamp")) or pod.get("status", {}).get("phase") in {
        "Succeeded",
        "Failed",
    }


def _atoi(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _quantity(value: Any) -> int:
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "m": 0}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return 0 if factor == 0 else int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (and --tls-key)")
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--podman-network", default="", help="run pods as podman containers on this network")
    parser.add_argument("--nodes", type=Path, required=True)
    parser.add_argument("--no-kubelet", action="store_true")
    parser.add_argument("--extender", help="URL of the scheduler extender for pods of --scheduler-name")
    parser.add_argument("--scheduler-name", default="gpuslice-scheduler")
    parser.add_argument("--rbac", type=Path, help="tokens and RBAC objects to enforce (see the module doc)")
    parser.add_argument("--schedulers", default="default-scheduler", help="scheduler names that run, comma-separated")
    args = parser.parse_args()
    server = ApiServer(
        json.loads(args.nodes.read_text()),
        kubelet=not args.no_kubelet,
        extender=args.extender,
        scheduler_name=args.scheduler_name,
        rbac=json.loads(args.rbac.read_text()) if args.rbac else None,
        schedulers=frozenset(args.schedulers.split(",")),
        podman_network=args.podman_network,
    )
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    web.run_app(server.app(), host=args.host, port=args.port, ssl_context=tls, print=None)


if __name__ == "__main__":
    main()
