"""The API double's named groups beside core/v1: ``resource.k8s.io/v1`` (tests/kube/dra.py) and KAI's
``scheduling.run.ai/v2`` (tests/kube/kai.py), and their parts of scheduling.

A mixin of ``ApiServer`` (tests/kube/apiserver.py registers its routes with one call and asks it first
in ``_schedule``): objects of these groups are stored as ``<plural>.<group>`` and served at
``/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>]`` (list, create, get, delete; lists of a
namespaced resource across namespaces too). A pod with ``spec.resourceClaims`` gets its claims made and
allocated before it is bound (or stays Pending with kube-scheduler's words); a pod for ``kai-scheduler``
(when that scheduler runs: ``--schedulers ...,kai-scheduler``) is placed as KAI places a fraction.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.kube import dra, kai

Obj = dict[str, Any]
GROUPS = {(dra.GROUP, dra.VERSION): dra.RESOURCES, (kai.GROUP, kai.VERSION): kai.RESOURCES}


def _error(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return web.json_response({**body, "message": message, "reason": reason, "code": code}, status=code)


class GroupsMixin:
    """Needs ``self.store`` (put, delete, items, objects), ``_place``, ``_unschedulable``, ``_event``,
    ``schedulers``: ApiServer's."""

    store: Any

    def add_group_routes(self, app: web.Application) -> None:
        base = "/apis/{group}/{version}"
        for path in (f"{base}/{{resource}}", f"{base}/namespaces/{{namespace}}/{{resource}}"):
            app.router.add_get(path, self.group_list)
            app.router.add_post(path, self.group_create)
            app.router.add_get(path + "/{name}", self.group_read)
            app.router.add_delete(path + "/{name}", self.group_delete)

    @staticmethod
    def _resource(request: web.Request) -> tuple[str, str, bool] | None:
        """(store key, kind, namespaced) of the request's resource; None: not served."""
        info = request.match_info
        resources = GROUPS.get((info["group"], info["version"]))
        if resources is None or info["resource"] not in resources:
            return None
        kind, namespaced = resources[info["resource"]]
        return f"{info['resource']}.{info['group']}", kind, namespaced

    def _not_found(self, request: web.Request) -> web.Response:
        resource = request.match_info["resource"]
        return _error(404, "NotFound", f"the server could not find the requested resource ({resource})")

    async def group_list(self, request: web.Request) -> web.Response:
        found = self._resource(request)
        if found is None:
            return self._not_found(request)
        key, kind, _ = found
        items = self.store.items(key, request.match_info.get("namespace"))
        api_version = f"{request.match_info['group']}/{request.match_info['version']}"
        meta = {"resourceVersion": str(self.store.current)}
        return web.json_response({"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items})

    async def group_create(self, request: web.Request) -> web.Response:
        found = self._resource(request)
        if found is None:
            return self._not_found(request)
        key, kind, namespaced = found
        namespace = request.match_info.get("namespace", "")
        if namespaced != bool(namespace):
            return self._not_found(request)
        obj = await request.json()
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return _error(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        if (key, namespace, name) in self.store.objects:
            return _error(
                409,
                "AlreadyExists",
                f'{request.match_info["resource"]}.{request.match_info["group"]} "{name}" already exists',
            )
        obj.update(kind=kind, apiVersion=f"{request.match_info['group']}/{request.match_info['version']}")
        await self.store.put(key, namespace, obj, "ADDED")
        return web.json_response(obj, status=201)

    async def group_read(self, request: web.Request) -> web.Response:
        found = self._resource(request)
        obj = (
            None
            if found is None
            else self.store.objects.get((found[0], request.match_info.get("namespace", ""), request.match_info["name"]))
        )
        if obj is None:
            return _error(404, "NotFound", f'{request.match_info["resource"]} "{request.match_info["name"]}" not found')
        return web.json_response(obj)

    async def group_delete(self, request: web.Request) -> web.Response:
        found = self._resource(request)
        namespace = request.match_info.get("namespace", "")
        obj = None if found is None else await self.store.delete(found[0], namespace, request.match_info["name"])
        if obj is None:
            return _error(404, "NotFound", f'{request.match_info["resource"]} "{request.match_info["name"]}" not found')
        return web.json_response(obj)

    # -- scheduling ---------------------------------------------------------------------

    async def schedule_in_groups(self, pod: Obj, nodes: list[Obj]) -> bool:
        """Schedule ``pod`` if it is these groups' to schedule (True: done here, placed or left Pending)."""
        if pod["spec"].get("schedulerName") == kai.SCHEDULER:
            if kai.SCHEDULER in self.schedulers:  # type: ignore[attr-defined]
                await self._schedule_kai(pod, nodes)
            return True
        if pod["spec"].get("resourceClaims"):
            await self._schedule_dra(pod, nodes)
            return True
        return False

    async def _schedule_dra(self, pod: Obj, nodes: list[Obj]) -> None:
        claims = []
        namespace = pod["metadata"]["namespace"]
        statuses = []
        for pod_claim in pod["spec"]["resourceClaims"]:
            template_name = pod_claim.get("resourceClaimTemplateName")
            if not template_name:
                claim = self.store.objects.get(
                    ("resourceclaims.resource.k8s.io", namespace, pod_claim.get("resourceClaimName"))
                )
            else:
                template = self.store.objects.get(("resourceclaimtemplates.resource.k8s.io", namespace, template_name))
                if template is None:
                    message = f'resourceclaimtemplate.resource.k8s.io "{template_name}" not found'
                    await self._event(pod, "Warning", "FailedResourceClaimCreation", message)  # type: ignore[attr-defined]
                    await self._unschedulable(pod, len(nodes), f"{len(nodes)} {message}")  # type: ignore[attr-defined]
                    return
                claim = dra.claim_for(pod, pod_claim, template)
                await self.store.put("resourceclaims.resource.k8s.io", namespace, claim, "ADDED")
                statuses.append({"name": pod_claim["name"], "resourceClaimName": claim["metadata"]["name"]})
            if claim is None:
                await self._unschedulable(pod, len(nodes), f"{len(nodes)} resourceclaim not found")  # type: ignore[attr-defined]
                return
            claims.append(claim)
        if statuses:
            pod["status"]["resourceClaimStatuses"] = statuses
        slices = self.store.items("resourceslices.resource.k8s.io", None)
        classes = {c["metadata"]["name"]: c for c in self.store.items("deviceclasses.resource.k8s.io", None)}
        for node in nodes:
            name = node["metadata"]["name"]
            others = [c for c in self.store.items("resourceclaims.resource.k8s.io", None) if c not in claims]
            results = []
            for claim in claims:
                found = dra.allocate(claim, name, slices, classes, others)
                if found is None:
                    break
                results.append(found)
                others.append({"status": {"allocation": dra.allocation(found, name)}})
            else:
                for claim, found in zip(claims, results, strict=True):
                    reserved = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
                    claim["status"] = {"allocation": dra.allocation(found, name), "reservedFor": [reserved]}
                    await self.store.put("resourceclaims.resource.k8s.io", namespace, claim, "MODIFIED")
                await self._place(pod, name)  # type: ignore[attr-defined]
                return
        await self._unschedulable(pod, len(nodes), f"{len(nodes)} {dra.UNALLOCATABLE}")  # type: ignore[attr-defined]

    async def forget_claims(self, pod: Obj) -> None:
        """Garbage collection: the claims the pod owns go with it."""
        uid = pod["metadata"].get("uid")
        for claim in self.store.items("resourceclaims.resource.k8s.io", pod["metadata"]["namespace"]):
            if any(o.get("uid") == uid for o in claim["metadata"].get("ownerReferences") or []):
                await self.store.delete(
                    "resourceclaims.resource.k8s.io", claim["metadata"]["namespace"], claim["metadata"]["name"]
                )

    async def _schedule_kai(self, pod: Obj, nodes: list[Obj]) -> None:
        problem = kai.queue_problem(pod, self.store.items("queues.scheduling.run.ai", None))
        if problem:
            await self._kai_unschedulable(pod, problem)
            return
        if not kai.is_fraction(pod):
            await self._place(pod, nodes[0]["metadata"]["name"])  # type: ignore[attr-defined]
            return
        placed = kai.place(pod, nodes, self.store.items("pods", None))
        if isinstance(placed, str):
            await self._kai_unschedulable(pod, placed)
            return
        node, group, reservation = placed
        if reservation is not None:
            reservation["status"] = {"phase": "Running"}
            await self.store.put("pods", kai.RESERVATION_NAMESPACE, reservation, "ADDED")
        pod["metadata"].setdefault("labels", {})[kai.GPU_GROUP] = group
        pod["metadata"].setdefault("annotations", {})["received-resource-type"] = "Fraction"
        await self._place(pod, node)  # type: ignore[attr-defined]

    async def _kai_unschedulable(self, pod: Obj, message: str) -> None:
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ]
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        await self._event(pod, "Warning", "Unschedulable", message)  # type: ignore[attr-defined]
