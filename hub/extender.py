"""`gpuslice scheduler-extender`: kube-scheduler's extender HTTP API backed by our placement.

kube-scheduler POSTs JSON to ``{urlPrefix}/filter``, ``/prioritize`` and ``/bind``
(the verbs in its KubeSchedulerConfiguration); the decisions are spawner/extender.py's.
As kube-scheduler reads the answers (pkg/scheduler/extender.go): anything but HTTP 200 is an
error of the extender, so a request the extender cannot serve is answered 200 with the
result's ``Error`` (filter, bind); a body that is no JSON is a 400, as the extender in
kube-scheduler's own integration test answers it; a prioritize that fails is a 500 (its
result has no Error field, and kube-scheduler goes on without its scores).
Every request reads the cluster afresh through the ``KubeClient`` it is given, so the
extender keeps no state of its own: the pods' device annotations are the state. Bind
writes the device annotations first and then binds, as gpushare's and HAMi's own
extenders do, so the device plugin finds them when the kubelet starts the pod.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from hub.malloc import keep_freed_memory
from spawner import environ, extender
from spawner.sharing import SharingBackend

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# What a request the extender cannot serve raises on its way (the message goes back as the Error).
REFUSALS = (extender.ExtenderError, KeyError, ValueError, TypeError, AttributeError)


class KubeClient(Protocol):
    """The four calls the extender makes to the Kubernetes API."""

    async def nodes(self) -> list[dict[str, Any]]: ...

    async def pods(self) -> list[dict[str, Any]]: ...

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    async def bind_pod(self, namespace: str, binding: dict[str, Any]) -> None: ...


class RestKubeClient:
    """The Kubernetes REST API over HTTP(S); in a pod, with its service account's token."""

    def __init__(self, base_url: str, token: str = "", ca_file: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ssl: Any = None
        if ca_file:
            import ssl

            self.ssl = ssl.create_default_context(cafile=ca_file)

    @classmethod
    def in_cluster(cls) -> RestKubeClient:
        url = environ.read().kube_api_url()
        if url is None:
            raise RuntimeError("not in a Kubernetes pod: give --api-server URL")
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        return cls(url, token, str(SERVICE_ACCOUNT / "ca.crt"))

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = {**self.headers, "Content-Type": content_type}
        data = None if body is None else json.dumps(body)
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.base_url + path, data=data, headers=headers, ssl=self.ssl) as response,
        ):
            text = await response.text()
            if response.status >= 400:
                raise extender.ExtenderError(f"{method} {path}: HTTP {response.status}: {text[:300]}")
            return json.loads(text) if text else None

    async def nodes(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/api/v1/nodes"))["items"])

    async def pods(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/api/v1/pods"))["items"])

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        patch = {"metadata": {"annotations": annotations}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await self._call("PATCH", path, patch, "application/strategic-merge-patch+json")

    async def bind_pod(self, namespace: str, binding: dict[str, Any]) -> None:
        name = binding["metadata"]["name"]
        await self._call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)


def make_app(
    client: KubeClient, backend: SharingBackend, policy: str = "default", clock: Callable[[], int] = time.time_ns
) -> web.Application:
    """The extender's HTTP app. One decision at a time: a bind changes what the next filter sees."""
    lock = asyncio.Lock()

    async def filter_(request: web.Request) -> web.Response:
        args = await arguments(request)
        async with lock:
            try:
                answer = extender.filter_nodes(args, await client.nodes(), await client.pods(), backend)
            except REFUSALS as exc:
                answer = {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "Error": str(exc)}
        return web.json_response(answer)

    async def prioritize(request: web.Request) -> web.Response:
        args = await arguments(request)
        async with lock:
            try:
                scores = extender.prioritize(args, await client.nodes(), await client.pods(), backend, policy)
            except REFUSALS as exc:
                return web.json_response({"Error": str(exc)}, status=500)
        return web.json_response(scores)

    async def bind(request: web.Request) -> web.Response:
        try:
            args = extender.decode(await arguments(request), extender.BINDING_FIELDS)
        except extender.ExtenderError as exc:
            return web.json_response({"Error": str(exc)})
        namespace, name, node = args["PodNamespace"], args["PodName"], args["Node"]
        async with lock:
            try:
                pods = await client.pods()
                pod = next(
                    p for p in pods if (p["metadata"].get("namespace"), p["metadata"]["name"]) == (namespace, name)
                )
                annotations = extender.bind_annotations(pod, node, await client.nodes(), pods, backend, policy, clock())
                if annotations:
                    await client.annotate_pod(namespace, name, annotations)
                await client.bind_pod(namespace, extender.binding(name, str(args.get("PodUID", "")), node))
            except StopIteration:
                return web.json_response({"Error": f"pod {namespace}/{name} not found"})
            except REFUSALS as exc:
                return web.json_response({"Error": str(exc)})
        return web.json_response({"Error": ""})

    async def arguments(request: web.Request) -> Any:
        try:
            return await request.json()
        except json.JSONDecodeError as exc:
            raise web.HTTPBadRequest(text=f"Decode error: {exc}") from exc

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_get("/healthz", healthz)
    return app


def serve(client: KubeClient, backend: SharingBackend, policy: str, address: str, port: int) -> None:
    # Decisions free and make again arrays of a few hundred KB: keep that memory mapped rather than
    # fault it in again at every decision (hub/malloc.py says why and what it costs).
    keep_freed_memory()
    web.run_app(make_app(client, backend, policy), host=address, port=port, print=None)
