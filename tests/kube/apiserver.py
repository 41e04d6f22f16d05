"""A Kubernetes API test double, served over HTTP, with a fake scheduler and kubelet.

The API: every resource of the groups in ``tests/kube/api/registry.py`` (core/v1: pods,
services, endpoints, configmaps, secrets, persistentvolumeclaims, serviceaccounts, events,
nodes, namespaces; apps/v1: deployments, daemonsets, replicasets, statefulsets; batch/v1:
jobs, cronjobs), with discovery, the real API's JSON shapes, watch protocol, errors (Status
objects) and the controllers clients count on (namespace lifecycle, garbage collection by
ownerReferences, graceful pod deletion, a default StorageClass's provisioner, each namespace's
``default`` ServiceAccount) and the Job and TTL-after-finished controllers (``tests/kube/job_controller.py``):
``tests/kube/api/rest.py`` says what is served and how. Pods
also have ``binding``, ``exec`` (the websocket channel protocol, v4 and v5), ``log`` (with
``follow`` and ``tailLines``) and ``eviction``.

The scheduler places a pod on a node with enough of every extended resource it asks for
(``aliyun.com/gpu-mem``, ``nvidia.com/gpu``, ...) or leaves it Pending with a
``FailedScheduling`` event worded as kube-scheduler words it. The kubelet
(``tests/kube/kubelet.py``) runs the pod as a local process on a loopback address of its own,
or with ``--podman-network`` as a podman container of its image, reports it Running with that
IP and Ready once its readiness probe (tcpSocket, httpGet, exec) passes, and stops it on
deletion (TERM, then KILL after the grace period).

A pod whose ``spec.schedulerName`` is the configured extender scheduler's (``--extender URL``)
and that asks for one of the extender's managed resources is scheduled as kube-scheduler
schedules with an extender that binds: the nodes that fit its extended resources (less
those the extender manages with ``ignoredByScheduler``) go to the extender's ``filter``
(as ``NodeNames``: the extender is ``nodeCacheCapable``), the survivors to ``prioritize``,
the highest score (first of ties) to ``bind``, and the extender binds through
``pods/{name}/binding`` after patching the pod's annotations.

With ``--rbac FILE`` it authenticates and authorizes as the real API server does with RBAC:
the bearer token names a user (``system:serviceaccount:<namespace>:<name>``), and a request
is allowed only when a Role (through a RoleBinding in the request's namespace) or a
ClusterRole (through a ClusterRoleBinding) grants its verb on its resource; otherwise 401
or 403 with the API server's wording. FILE: ``{"tokens": {token: user}, "objects": [Role,
ClusterRole, RoleBinding, ClusterRoleBinding ...]}``, e.g. a Helm chart's rendered RBAC.
With ``--schedulers a,b`` only pods whose ``schedulerName`` (default ``default-scheduler``)
is one of those are scheduled; a pod naming a scheduler that does not run stays Pending with
no event, as in a real cluster. Namespaces: the system ones and those of ``--namespaces a,b``
exist at the start (a real cluster's, made by ``kubectl create namespace``); creating in any
other is refused (404), as the NamespaceLifecycle admission plugin refuses it.

Run: ``python -m tests.kube.apiserver --port P --nodes nodes.json`` (nodes: Node objects).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import ssl
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from tests.kube.api import errors
from tests.kube.api.errors import ApiError
from tests.kube.api.rest import Rest, Target, flag, is_watch, verb
from tests.kube.api.selectors import matches_labels
from tests.kube.api.store import Store, now
from tests.kube.apiserver_groups import GroupsMixin
from tests.kube.job_controller import JobController
from tests.kube.kubelet import (
    ContainerFailedError,
    PodmanKubelet,
    ProcessKubelet,
    image_map,
    pod_addresses,
    sandbox,
)

__all__ = ["MANAGED", "ApiServer", "matches_labels", "pod_addresses", "rbac_allows"]

Obj = dict[str, Any]
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
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
WAITING = ("ErrImagePull", "CreateContainerConfigError", "FailedMount")  # what the kubelet waits out
RETRY_S = 2.0
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


def rbac_allows(objects: list[Obj], user: str, verb: str, resource: str, namespace: str, group: str = "") -> bool:
    """Whether RBAC objects grant user the verb on a resource of group; namespace "" is cluster scope."""
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
                _has(rule.get("apiGroups"), group)
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


def exit_status(command: list[str], code: int) -> Obj:
    """The exec error channel's last message: v4's Status of the command's exit."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    message = f"command terminated with non-zero exit code: error executing command {command}, exit code {code}"
    causes = [{"reason": "ExitCode", "message": str(code)}]
    return {
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NonZeroExitCode",
        "details": {"causes": causes},
    }


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
        namespaces: tuple[str, ...] = (),
        images: dict[str, str] | None = None,
    ) -> None:
        self.extender = extender
        # The extender's managedResources: resource -> ignoredByScheduler. As in kube-scheduler,
        # the extender is asked only about pods that ask for one of them, and the scheduler's
        # own fit check skips the ignored ones (HAMi's memory and cores are no node resources).
        self.managed = MANAGED if managed is None else managed
        self.scheduler_name = scheduler_name
        self.store = Store()
        self.rest = Rest(self.store)
        self.rest.on_created = {
            "pods": self._schedule_created,
            "persistentvolumeclaims": self._provision,
            "queues.scheduling.run.ai": self.account_queues,
        }
        self.rest.on_removed = {"pods": self._requeue}
        self.scheduling = asyncio.Lock()  # one pod placed at a time, as kube-scheduler's one scheduling cycle
        self.rest.stop_pod = self._stop_pod
        self.rest.subresource_handlers = {
            ("pods", "binding"): self.binding,
            ("pods", "exec"): self.exec,
            ("pods", "log"): self.log,
            ("pods", "eviction"): self.eviction,
        }
        self.initial_nodes = nodes
        self.initial_namespaces = namespaces
        self.kubelet = kubelet
        self.rbac = rbac
        self.schedulers = schedulers or frozenset({"default-scheduler"})
        self.root = Path(tempfile.mkdtemp(prefix="gpuslice-double-"))
        # With a podman network, the kubelet runs each pod as a container of its image there.
        self.runtime: ProcessKubelet | PodmanKubelet = (
            PodmanKubelet(podman_network, self.root, images) if podman_network else ProcessKubelet(self.root)
        )
        self.started: set[str] = set()  # uids of pods whose container the kubelet started

    # -- routing ------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.authorize, self.faults], client_max_size=64 * 2**20)
        app.on_startup.append(self._load)
        app.on_cleanup.append(self._stop_all)
        app.router.add_get("/version", self.version)
        app.router.add_post("/_test/faults", self.add_fault)
        app.router.add_get("/_test/faults", self.list_faults)
        app.router.add_post("/_test/evict/{namespace}/{name}", self.evict)
        app.router.add_route("*", "/api{tail:(/.*)?}", self.rest.handle)
        app.router.add_route("*", "/apis{tail:(/.*)?}", self.rest.handle)
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
                    return await self.rest.gone(request, "too old resource version (injected)")
                return ApiError(int(fault["status"]), "InternalError", "injected fault").response()
        return await handler(request)

    @web.middleware
    async def authorize(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        """RBAC as the API server applies it (only with --rbac; the test hooks under /_test are open)."""
        if self.rbac is None or request.path == "/version" or request.path.startswith("/_test/"):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = self.rbac["tokens"].get(token) if scheme == "Bearer" else None
        if user is None:
            return ApiError(401, "Unauthorized", "Unauthorized").response()
        try:
            target = self.rest.parse(request.path)
        except ApiError as error:
            return error.response()
        if target is None:
            return await handler(request)  # discovery: system:discovery grants it to every authenticated user
        wanted = verb(request.method, target, is_watch(request))
        resource = f"{target.plural}/{target.sub}" if target.sub else target.plural
        if not rbac_allows(self.rbac["objects"], user, wanted, resource, target.namespace, target.group.name):
            where = f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
            named = f'{target.plural} "{target.name}"' if target.name else target.plural
            qualified = f"{named}.{target.group.name}" if target.group.name and not target.name else named
            message = (
                f'{qualified} is forbidden: User "{user}" cannot {wanted} resource "{resource}" '
                f'in API group "{target.group.name}" {where}'
            )
            return ApiError(403, "Forbidden", message, {"name": target.name, "kind": target.plural}).response()
        return await handler(request)

    @staticmethod
    def _matches(fault: dict[str, Any], request: web.Request) -> bool:
        return (
            request.method == fault["method"]
            and fault["path_contains"] in request.path
            and fault.get("query_contains", "") in request.query_string
        )

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"major": "1", "minor": "30", "gitVersion": "v1.30.0-gpuslice-double", "platform": "linux/amd64"}
        )

    async def _load(self, app: web.Application) -> None:
        await self.rest.start(self.initial_namespaces)
        for node in self.initial_nodes:
            node.setdefault("kind", "Node")
            node.setdefault("apiVersion", "v1")
            await self.store.put("nodes", "", node, "ADDED")
        self.rest.spawn(JobController(self.store, self.rest).run())  # batch/v1 Jobs run their pods

    # -- pods' subresources -----------------------------------------------------------

    def _pod(self, target: Target) -> Obj:
        pod = self.store.get("pods", target.namespace, target.name)
        if pod is None:
            raise target.not_found()
        return pod

    async def binding(self, request: web.Request, target: Target) -> web.Response:
        if request.method != "POST":
            raise errors.method_not_allowed(request.method)
        pod = self._pod(target)
        body = await request.json()
        node = (body.get("target") or {}).get("name", "")
        if pod["spec"].get("nodeName"):
            raise errors.conflict(
                "pods", target.name, f'pod {target.name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        if self.store.get("nodes", "", node) is None:
            raise errors.not_found("nodes", node)
        await self._place(pod, node)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
        )

    async def eviction(self, request: web.Request, target: Target) -> web.Response:
        """policy/v1 Eviction: no PodDisruptionBudget here, so the pod is deleted (gracefully)."""
        if request.method != "POST":
            raise errors.method_not_allowed(request.method)
        pod = self._pod(target)
        options = (await self.rest.body(request)).get("deleteOptions") or {}
        await self.rest.delete_pod(pod, options.get("gracePeriodSeconds"))
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
        )

    def _container(self, request: web.Request, pod: Obj) -> str:
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        name = request.query.get("container") or (names[0] if len(names) == 1 else "")
        if not name:
            choices = " ".join(names)
            why = f"a container name must be specified for pod {pod['metadata']['name']}, choose one of: [{choices}]"
            raise errors.bad_request(why)
        if name not in names:
            raise errors.bad_request(f"container {name} is not valid for pod {pod['metadata']['name']}")
        return name

    def _waiting(self, pod: Obj, container: str) -> str:
        """Why the container has no process yet ("" once it started)."""
        if pod["metadata"]["uid"] in self.started:
            return ""
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = status.get("state", {}).get("waiting")
            if status["name"] == container and waiting:
                return str(waiting.get("reason", "ContainerCreating"))
        return "ContainerCreating"

    async def log(self, request: web.Request, target: Target) -> web.StreamResponse:
        """``GET pods/{name}/log``: the container's output (``follow``, ``tailLines``) as text."""
        pod = self._pod(target)
        container = self._container(request, pod)
        if waiting := self._waiting(pod, container):
            why = "image can't be pulled" if waiting in ("ErrImagePull", "ImagePullBackOff") else waiting
            raise errors.bad_request(f'container "{container}" in pod "{target.name}" is waiting to start: {why}')
        follow = flag(request, "follow")
        tail = int(request.query["tailLines"]) if request.query.get("tailLines") else None
        argv, options = self.runtime.log_argv(pod, follow, tail)
        reader = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, **options
        )
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        try:
            assert reader.stdout is not None
            while chunk := await reader.stdout.read(65536):
                await response.write(chunk)
        finally:
            if reader.returncode is None:
                reader.kill()
            await reader.wait()
        return response

    async def exec(self, request: web.Request, target: Target) -> web.StreamResponse:
        """``pods/{name}/exec`` over a websocket: the command run in the pod, its output on channels 1 and 2,
        its exit on channel 3 as a Status (``v4.channel.k8s.io``; ``v5`` adds stdin's close on 255)."""
        pod = self._pod(target)
        command = request.query.getall("command", [])
        if not command:
            raise errors.bad_request("you must specify at least 1 command")
        container = self._container(request, pod)
        if not pod["spec"].get("nodeName"):
            raise errors.bad_request(f"pod {target.name} does not have a host assigned")
        if self._waiting(pod, container) or pod.get("status", {}).get("phase") != "Running":
            raise errors.bad_request(f'unable to upgrade connection: container not found ("{container}")')
        if not any(flag(request, name) for name in ("stdin", "stdout", "stderr")):
            raise errors.bad_request("you must specify at least one of stdin, stdout, stderr")
        socket = web.WebSocketResponse(protocols=EXEC_PROTOCOLS)
        if not socket.can_prepare(request).ok:
            raise errors.bad_request("Upgrade request required")
        await socket.prepare(request)
        wants = {name: flag(request, name) for name in ("stdin", "stdout", "stderr")}
        argv, options = self.runtime.exec_argv(pod, command)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if wants["stdin"] else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                **options,
            )
        except OSError as error:
            failure = ApiError(
                500, "InternalError", f"Internal error occurred: error executing command in container: {error}"
            )
            await socket.send_bytes(bytes([ERROR]) + json.dumps(failure.status()).encode())
            await socket.close()
            return socket

        async def pump(stream: asyncio.StreamReader | None, channel: int, wanted: bool) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                if wanted:
                    await socket.send_bytes(bytes([channel]) + chunk)

        async def feed() -> None:
            async for message in socket:  # text frames too: the API server reads either kind as bytes
                if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT) or process.stdin is None:
                    continue
                data = message.data.encode() if isinstance(message.data, str) else message.data
                if data[:1] == bytes([STDIN]):
                    process.stdin.write(data[1:])
                    await process.stdin.drain()
                elif data[:1] == bytes([CLOSE]) and data[1:2] == bytes([STDIN]):
                    process.stdin.close()

        feeding = asyncio.get_running_loop().create_task(feed())
        await asyncio.gather(
            pump(process.stdout, STDOUT, wants["stdout"]), pump(process.stderr, STDERR, wants["stderr"])
        )
        code = await process.wait()
        await socket.send_bytes(bytes([ERROR]) + json.dumps(exit_status(command, code)).encode())
        feeding.cancel()
        await socket.close()
        return socket

    # -- controllers --------------------------------------------------------------------

    async def _schedule_created(self, pod: Obj) -> None:
        if pod["spec"].get("nodeName"):  # created bound: no scheduler sees it, the node's kubelet runs it
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]
            if self.kubelet:
                self.rest.spawn(self._run(pod))
            return
        async with self.scheduling:
            await self._schedule(pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _requeue(self, removed: Obj) -> None:
        """kube-scheduler moves its unschedulable pods back to the queue when a pod leaves a node:
        each pod still unplaced is tried again, oldest first (a terminating pod held its room till now)."""
        await self.account_queues()  # KAI's queue counted it
        if removed.get("spec", {}).get("nodeName"):
            await self._retry_unschedulable()

    async def _finished(self, pod: Obj) -> None:
        """A pod that ran to Succeeded or Failed leaves its node to kube-scheduler as a deleted one does: its
        informer lists pods with status.phase!=Succeeded,status.phase!=Failed, so the pod's room is free
        (``_free``) and its unschedulable pods are tried again, though the pod object stays (a Job's does)."""
        await self._retry_unschedulable()

    async def _retry_unschedulable(self) -> None:
        async with self.scheduling:
            waiting = [
                p
                for p in self.store.items("pods", None)
                if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            ]
            for pod in sorted(waiting, key=lambda p: p["metadata"]["creationTimestamp"]):
                if any(c.get("reason") == "Unschedulable" for c in pod["status"].get("conditions") or []):
                    await self._schedule(pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _provision(self, claim: Obj) -> None:
        """A default StorageClass's provisioner (Immediate binding): the claim is Bound to a new volume."""
        meta = claim["metadata"]
        if self.store.get("persistentvolumeclaims", meta["namespace"], meta["name"]) is not claim:
            return
        requested = (claim["spec"].get("resources") or {}).get("requests") or {}
        claim["spec"]["volumeName"] = f"pvc-{meta['uid']}"
        claim["spec"].setdefault("storageClassName", "standard")
        meta.setdefault("annotations", {})["pv.kubernetes.io/bind-completed"] = "yes"
        claim["status"] = {
            "phase": "Bound",
            "accessModes": claim["spec"].get("accessModes") or ["ReadWriteOnce"],
            "capacity": {"storage": requested.get("storage", "1Gi")},
        }
        await self.store.put("persistentvolumeclaims", meta["namespace"], claim, "MODIFIED")

    async def _place(self, pod: Obj, node: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]
        await self.store.put("pods", namespace, pod, "MODIFIED")
        await self._event(pod, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}")
        if self.kubelet:
            self.rest.spawn(self._run(pod))

    def _free(self, node: Obj) -> dict[str, int]:
        free = {k: _quantity(v) for k, v in (node.get("status", {}).get("allocatable") or {}).items()}
        for pod in self.store.items("pods", None):
            if pod["spec"].get("nodeName") == node["metadata"]["name"] and not _terminal(pod):
                for resource, amount in _limits(pod).items():
                    free[resource] = free.get(resource, 0) - amount
        return free

    def _runs(self, scheduler: str) -> bool:
        """Whether a scheduler of that name runs: a named one, or the extender's when it has one."""
        return scheduler in self.schedulers or (self.extender is not None and scheduler == self.scheduler_name)

    async def _schedule(self, namespace: str, name: str) -> None:
        pod = self.store.get("pods", namespace, name)
        if pod is None or pod["spec"].get("nodeName"):
            return  # gone, or bound already
        if not self._runs(pod["spec"].get("schedulerName") or "default-scheduler"):
            return  # no scheduler of that name runs: the pod waits, and nothing says why
        asked = {k: v for k, v in _limits(pod).items() if "/" in k}  # extended resources decide here
        nodes = self.store.items("nodes", None)
        if await self.schedule_in_groups(pod, nodes):  # DRA claims, KAI's pods (tests/kube/apiserver_groups.py)
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

    async def _unschedulable(self, pod: Obj, total: int, parts: str, postfilter: str = "") -> None:
        """Pending with kube-scheduler's FitError: the filters' reasons, then its PostFilter plugins' (default:
        DefaultPreemption finding no lower-priority pod to evict on nodes a filter called Unschedulable)."""
        postfilter = (
            postfilter
            or f"preemption: 0/{total} nodes are available: {total} No preemption victims found for incoming pod."
        )
        message = f"0/{total} nodes are available: {parts}. {postfilter}"
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
                failed = {**(filtered.get("FailedNodes") or {}), **(filtered.get("FailedAndUnresolvableNodes") or {})}
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

    # -- the kubelet ----------------------------------------------------------------------

    async def _run(self, pod: Obj) -> None:
        """The kubelet starts the pod's container. What it needs and is not there yet (a Secret, a
        ConfigMap, a claim, the image) leaves it waiting, tried again every RETRY_S as the kubelet
        tries again, until it is there or the pod is deleted (KubeSpawner makes a pod's Secret
        after the pod, which names it)."""
        self._gpushare_assign(pod)
        meta = pod["metadata"]
        reported = ""
        while True:
            current = self.store.get("pods", meta["namespace"], meta["name"])
            if current is None or current["metadata"]["uid"] != meta["uid"] or meta.get("deletionTimestamp"):
                return
            services = self.store.items("services", meta["namespace"])
            try:
                made = sandbox(pod, self.store.get, services, self.root)
                address = await asyncio.to_thread(self.runtime.start, pod, made)
                break
            except ContainerFailedError as exc:
                if exc.reason not in WAITING:
                    await self._failed_to_start(pod, exc)
                    return
                if str(exc) != reported:
                    await self._failed_to_start(pod, exc)
                    reported = str(exc)
            await asyncio.sleep(RETRY_S)
        self.started.add(meta["uid"])
        await self._running(pod, address)
        asyncio.get_running_loop().create_task(self._watch_container(pod))

    async def _failed_to_start(self, pod: Obj, exc: ContainerFailedError) -> None:
        """An image that cannot be pulled or a missing ConfigMap/Secret leaves the pod Pending, waiting
        (the kubelet retries); a container that cannot start fails it (restartPolicy Never, as KubeSpawner sets)."""
        container = pod["spec"]["containers"][0]
        waiting = exc.reason in WAITING
        reason = "ContainerCreating" if exc.reason == "FailedMount" else exc.reason
        state = (
            {"waiting": {"reason": reason, "message": str(exc)}}
            if waiting
            else {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc), "finishedAt": now()}}
        )
        pod["status"].update(
            phase="Pending" if waiting else "Failed",
            containerStatuses=[
                {
                    "name": container["name"],
                    "ready": False,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "started": False,
                    "state": state,
                }
            ],
        )
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        if not waiting:
            await self._finished(pod)
        if exc.reason == "FailedMount":
            await self._event(pod, "Warning", "FailedMount", str(exc))
        else:
            await self._event(pod, "Warning", "Failed", str(exc) if exc.image else f"Error: {exc}")

    async def _running(self, pod: Obj, address: str) -> None:
        container = pod["spec"]["containers"][0]
        probe = container.get("readinessProbe")
        ready = "False" if probe else "True"
        pod["status"].update(
            phase="Running",
            podIP=address,
            podIPs=[{"ip": address}],
            hostIP="127.0.0.1",
            startTime=now(),
            conditions=[
                {
                    "type": t,
                    "status": "True" if t in ("PodScheduled", "Initialized") else ready,
                    "lastTransitionTime": now(),
                }
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            containerStatuses=[
                {
                    "name": container["name"],
                    "ready": not probe,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "started": True,
                    "state": {"running": {"startedAt": now()}},
                }
            ],
        )
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        await self._event(pod, "Normal", "Started", f"Started container {container['name']}")
        if probe:
            asyncio.get_running_loop().create_task(self._probe(pod, container, probe, address))

    async def _probe(self, pod: Obj, container: Obj, probe: Obj, address: str) -> None:
        """The readiness probe, every periodSeconds until it first passes; then the pod is Ready."""
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        uid = pod["metadata"]["uid"]
        while (current := self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])) is not None:
            if current["metadata"]["uid"] != uid or current["status"].get("phase") != "Running":
                return
            if await self._probe_passes(pod, container, probe, address):
                for condition in current["status"]["conditions"]:
                    condition["status"] = "True"
                current["status"]["containerStatuses"][0]["ready"] = True
                await self.store.put("pods", pod["metadata"]["namespace"], current, "MODIFIED")
                return
            await asyncio.sleep(period)

    async def _probe_passes(self, pod: Obj, container: Obj, probe: Obj, address: str) -> bool:
        def port_of(value: Any) -> int:
            named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
            return int(named.get(value, value))

        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "tcpSocket" in probe:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port_of(probe["tcpSocket"]["port"])), timeout
                )
                writer.close()
                return True
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"{get.get('scheme', 'HTTP').lower()}://{address}:{port_of(get['port'])}{get.get('path', '/')}"
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(
                        url, ssl=False, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout)
                    ) as answer,
                ):
                    return 200 <= answer.status < 400
            if "exec" in probe:
                argv, options = self.runtime.exec_argv(pod, probe["exec"]["command"])
                checked = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, **options
                )
                return await asyncio.wait_for(checked.wait(), timeout) == 0
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False
        return False

    async def _watch_container(self, pod: Obj) -> None:
        """A container that exits on its own leaves its pod Failed or Succeeded (restartPolicy Never,
        as KubeSpawner sets)."""
        meta = pod["metadata"]
        while (code := await asyncio.to_thread(self.runtime.exit_code, pod)) is None:
            await asyncio.sleep(self.runtime.poll_s)
        current = self.store.get("pods", meta["namespace"], meta["name"])
        if (
            current is None
            or current["metadata"]["uid"] != meta["uid"]
            or code < 0
            or current["metadata"].get("deletionTimestamp")
        ):
            return  # deleted, or being deleted
        status = current["status"]
        status["phase"] = "Failed" if code else "Succeeded"
        for condition in status.get("conditions") or []:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "False"
        status["containerStatuses"][0].update(
            ready=False, state={"terminated": {"exitCode": code, "finishedAt": now()}}
        )
        await self.store.put("pods", meta["namespace"], current, "MODIFIED")
        await self._finished(current)

    async def _stop_pod(self, pod: Obj, grace: float) -> None:
        if pod["metadata"]["uid"] in self.started:
            await asyncio.to_thread(self.runtime.stop, pod, grace)
            self.started.discard(pod["metadata"]["uid"])

    async def evict(self, request: web.Request) -> web.Response:
        """What a node-pressure eviction does: the container is killed, the pod Failed with reason Evicted."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return errors.not_found("pods", name).response()
        await self._stop_pod(pod, 0)
        pod["status"].update(
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        )
        for container in pod["status"].get("containerStatuses") or []:
            container.update(
                ready=False, state={"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now()}}
            )
        await self.store.put("pods", namespace, pod, "MODIFIED")
        await self._finished(pod)
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
        for _, _, pod in [e for e in self.store.everything() if e[0] == "pods"]:
            with contextlib.suppress(Exception):
                await self._stop_pod(pod, 0)
        shutil.rmtree(self.root, ignore_errors=True)  # the pods' folders: ~55 a suite run were left in /tmp


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


def _terminal(pod: Obj) -> bool:
    """Succeeded or Failed: a pod kube-scheduler no longer counts on its node."""
    return pod.get("status", {}).get("phase") in {"Succeeded", "Failed"}


def _gpushare_complete(pod: Obj) -> bool:
    """gpushare's utils.IsCompletePod."""
    return bool(pod["metadata"].get("deletionTimestamp")) or _terminal(pod)


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
    parser.add_argument("--images", type=Path, help="JSON {image a cluster pulls: image built here} for podman pods")
    parser.add_argument("--nodes", type=Path, required=True)
    parser.add_argument("--namespaces", default="", help="namespaces that exist at the start, comma-separated")
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
        namespaces=tuple(n for n in args.namespaces.split(",") if n),
        images=image_map(args.images.read_text()) if args.images else None,
    )
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    # On SIGTERM, open watches are not waited for long: a real API server drops them too.
    web.run_app(server.app(), host=args.host, port=args.port, ssl_context=tls, print=None, shutdown_timeout=5)


if __name__ == "__main__":
    main()
