"""Any registered resource served as the API server serves it.

Paths: ``/api``, ``/apis``, ``/apis/{group}`` and each group version's resource list (discovery);
``{prefix}/{plural}`` (a cluster-scoped collection, or a namespaced one across namespaces),
``{prefix}/namespaces/{ns}/{plural}``, ``.../{name}`` and ``.../{name}/{subresource}``, and the
legacy ``{prefix}/watch/...``. Verbs: get, list (``labelSelector``, ``fieldSelector``, ``limit``
and ``continue``), watch (``resourceVersion``; none or "0" first sends the current objects as
ADDED; a compacted one is 410 Expired), create (``generateName``, ``dryRun``, the name rules,
the namespace lifecycle), update (``resourceVersion`` as a precondition), patch (the three
formats of ``patch``), delete (``gracePeriodSeconds``, ``propagationPolicy``, preconditions,
finalizers) and deletecollection; ``status`` subresources; other subresources are handed to
the server that owns them (``subresource_handlers``).

Controllers the API server's users count on, and that run here: the namespace controller
(a deleted namespace is Terminating until everything in it is gone), the garbage collector
(an object whose owners, by ``ownerReferences``, are all gone is deleted; ``Orphan`` and
``Foreground`` propagation), the service-account controller (each namespace gets ``default``).
Pods are deleted gracefully when bound to a node: they keep a ``deletionTimestamp`` until the
kubelet (``stop_pod``) has stopped them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import random
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tests.kube.api import errors, registry
from tests.kube.api.errors import ApiError
from tests.kube.api.patch import apply
from tests.kube.api.schema import Group, Resource
from tests.kube.api.selectors import field_matcher, label_matcher
from tests.kube.api.store import Store, now

Obj = dict[str, Any]
Handler = Callable[[web.Request, "Target"], Awaitable[web.StreamResponse]]
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_RULES = {
    "subdomain": (
        _SUBDOMAIN,
        253,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
        "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
    ),
    "label": (
        _LABEL,
        63,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
        "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    ),
    "label1035": (
        _LABEL_1035,
        63,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
        "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
        "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
    ),
}


@dataclass(frozen=True)
class Target:
    """What a resource path names."""

    group: Group
    resource: Resource
    namespace: str = ""  # "" for cluster-scoped resources and lists across namespaces
    name: str = ""
    sub: str = ""

    @property
    def key(self) -> str:
        return self.group.key(self.resource)

    @property
    def plural(self) -> str:
        return self.resource.plural

    def not_found(self) -> ApiError:
        return errors.not_found(self.plural, self.name, self.group.name)


def verb(method: str, target: Target, watch: bool) -> str:
    """The RBAC verb of a request."""
    if method == "GET":
        return "get" if target.name else "watch" if watch else "list"
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter, as Go's strconv.ParseBool reads it (clients send "true" or "True")."""
    return request.query.get(name, "") in ("1", "t", "T", "true", "True", "TRUE")


def is_watch(request: web.Request) -> bool:
    return flag(request, "watch") or "/watch/" in request.path


def stamp(offset_s: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_type(obj: Obj, group: Group, resource: Resource) -> Obj:
    return {"kind": resource.kind, "apiVersion": group.group_version, **obj}


def owners(obj: Obj) -> list[str]:
    return [ref["uid"] for ref in obj.get("metadata", {}).get("ownerReferences") or []]


class Rest:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.subresource_handlers: dict[tuple[str, str], Handler] = {}
        # After a create: the scheduler for pods, the volume binder for claims (set by the server).
        self.on_created: dict[str, Callable[[Obj], Awaitable[None]]] = {}
        # After an object left the store: the scheduler looks again at the pods it could not place.
        self.on_removed: dict[str, Callable[[Obj], Awaitable[None]]] = {}
        self.stop_pod: Callable[[Obj, float], Awaitable[None]] = self._no_kubelet
        self.tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    async def _no_kubelet(pod: Obj, grace: float) -> None:
        return None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def start(self, namespaces: tuple[str, ...] = ()) -> None:
        for name in dict.fromkeys((*SYSTEM_NAMESPACES, *namespaces)):
            await self.create_object(self._target("", "namespaces"), {"metadata": {"name": name}})

    @staticmethod
    def _target(group: str, plural: str, namespace: str = "", name: str = "") -> Target:
        served = next(g for g in registry.GROUPS if g.name == group)
        resource = served.resource(plural)
        assert resource is not None
        return Target(served, resource, namespace, name)

    # -- paths ----------------------------------------------------------------------------

    def parse(self, path: str) -> Target | None:
        """The resource a path names; None for discovery paths; ApiError(404) for anything else."""
        parts = [p for p in path.split("/") if p]
        if parts[0] == "api":
            if len(parts) < 3:
                return None
            served, rest = registry.group("", parts[1]), parts[2:]
        else:
            if len(parts) < 4:
                return None
            served, rest = registry.group(parts[1], parts[2]), parts[3:]
        if served is None:
            raise errors.no_such_resource()
        if rest[0] == "watch":
            rest = rest[1:]
        if not rest:
            raise errors.no_such_resource()
        inner = served.resource(rest[2]) if len(rest) > 2 and rest[0] == "namespaces" else None
        if inner is not None and inner.namespaced:
            if len(rest) > 5:
                raise errors.no_such_resource()
            target = Target(served, inner, rest[1], *([*rest[3:5], "", ""])[:2])
        else:
            resource = served.resource(rest[0])
            if resource is None or len(rest) > 3 or (resource.namespaced and len(rest) > 1):
                raise errors.no_such_resource()
            target = Target(served, resource, "", *([*rest[1:3], "", ""])[:2])
        if target.sub and target.sub not in target.resource.subresources:
            raise errors.no_such_resource()
        return target

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            target = self.parse(request.path)
            if target is None:
                return self.discovery(request)
            return await self.serve(request, target)
        except ApiError as error:
            return error.response()

    def discovery(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            raise errors.method_not_allowed(request.method)
        parts = [p for p in request.path.split("/") if p]
        if parts == ["api"]:
            return web.json_response(registry.api_versions(f"{request.host}"))
        if parts == ["apis"]:
            return web.json_response(registry.api_group_list())
        if len(parts) == 2 and parts[0] == "apis":
            document = registry.api_group(parts[1])
        else:
            served = registry.group("", parts[1]) if parts[0] == "api" else registry.group(parts[1], parts[2])
            document = registry.resource_list(served) if served else None
        if document is None:
            raise errors.no_such_resource()
        return web.json_response(document)

    async def serve(self, request: web.Request, target: Target) -> web.StreamResponse:
        watch = is_watch(request)
        wanted = verb(request.method, target, watch)
        if target.sub:
            handler = self.subresource_handlers.get((target.key, target.sub))
            if handler is not None:
                return await handler(request, target)
            if target.sub == "status":
                return await self.status_subresource(request, target)
            raise errors.method_not_allowed(request.method)
        if wanted not in target.resource.verbs:
            raise errors.method_not_allowed(request.method)
        if not target.name:
            if request.method == "GET":
                return await (self.watch_objects(request, target) if watch else self.list_objects(request, target))
            if request.method == "POST":
                created = await self.create_object(target, await self.body(request), dry_run="dryRun" in request.query)
                return web.json_response(created, status=201)
            if request.method == "DELETE":
                return await self.delete_collection(request, target)
        elif request.method == "GET":
            return web.json_response(self.read(target))
        elif request.method == "PUT":
            return web.json_response(await self.update(target, await self.body(request)))
        elif request.method == "PATCH":
            return web.json_response(await self.patch(target, request.content_type, await self.body(request)))
        elif request.method == "DELETE":
            text = await request.text()
            options = json.loads(text) if text.strip() else {}
            for name in ("gracePeriodSeconds", "propagationPolicy", "orphanDependents"):
                if name in request.query:
                    value = request.query[name]
                    options[name] = (
                        int(value)
                        if name == "gracePeriodSeconds"
                        else value == "true"
                        if name == "orphanDependents"
                        else value
                    )
            answer, accepted = await self.delete(target, options)
            return web.json_response(answer, status=202 if accepted else 200)
        raise errors.method_not_allowed(request.method)

    @staticmethod
    async def body(request: web.Request) -> Any:
        """The request's JSON body. The double reads JSON only: a protobuf (or CBOR) body, as kubectl
        writes, is refused as an API server refuses a media type it cannot decode."""
        kind = request.content_type
        if kind not in ("application/json", "") and not kind.endswith("+json"):
            accepted = "accepted media types include: application/json"
            raise ApiError(
                415, "UnsupportedMediaType", f'the body of the request was in an unknown format - {accepted} ("{kind}")'
            )
        text = await request.text()
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise errors.bad_request(f"error decoding request body: {error}") from error

    # -- read --------------------------------------------------------------------------

    def read(self, target: Target) -> Obj:
        obj = self.store.get(target.key, target.namespace, target.name)
        if obj is None:
            raise target.not_found()
        return with_type(obj, target.group, target.resource)

    def selected(self, request: web.Request, target: Target) -> Callable[[Obj], bool]:
        labels = label_matcher(request.query.get("labelSelector", ""))
        fields = field_matcher(request.query.get("fieldSelector", ""), target.resource.fields)
        return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)

    def scope(self, target: Target) -> str | None:
        """The namespace a collection request reads: None across namespaces (and for cluster scope)."""
        return target.namespace if target.resource.namespaced and target.namespace else None

    async def list_objects(self, request: web.Request, target: Target) -> web.Response:
        wanted = self.selected(request, target)
        items = [o for o in self.store.items(target.key, self.scope(target)) if wanted(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        meta: Obj = {"resourceVersion": str(self.store.current)}
        start = 0
        if request.query.get("continue"):
            try:
                start = int(json.loads(base64.b64decode(request.query["continue"]))["start"])
            except (ValueError, KeyError) as error:
                raise errors.bad_request("continue key is not valid") from error
        limit = int(request.query.get("limit") or 0)
        page = items[start : start + limit] if limit else items[start:]
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(json.dumps({"start": start + limit}).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        # List items carry no kind or apiVersion: the list's own say what they are.
        body = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]
        kind = f"{target.resource.kind}List"
        return web.json_response(
            {"kind": kind, "apiVersion": target.group.group_version, "metadata": meta, "items": body}
        )

    async def watch_objects(self, request: web.Request, target: Target) -> web.StreamResponse:
        wanted = self.selected(request, target)
        scope = self.scope(target)
        given = request.query.get("resourceVersion") or ""
        oldest = self.store.log[0][0] if self.store.log else self.store.current + 1
        since = int(given) if given not in ("", "0") else self.store.current
        if given not in ("", "0") and since < oldest - 1:
            return await self.gone(request, f"too old resource version: {since} ({oldest - 1})")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: Obj) -> None:
            event = {"type": kind, "object": with_type(obj, target.group, target.resource)}
            await response.write(json.dumps(event).encode() + b"\n")

        if given in ("", "0"):  # "Get State and Start at Most Recent": the current objects first
            for obj in self.store.items(target.key, scope):
                if wanted(obj):
                    await send("ADDED", obj)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds") or 1800)
        sent = since
        try:
            while loop.time() < deadline and request.transport is not None and not request.transport.is_closing():
                for rv, res, ns, kind, obj in list(self.store.log):
                    if rv > sent and res == target.key and (scope is None or ns == scope) and wanted(obj):
                        await send(kind, obj)
                sent = self.store.current
                async with self.store.changed:
                    with contextlib.suppress(TimeoutError):
                        left = min(1, max(0.01, deadline - loop.time()))
                        await asyncio.wait_for(self.store.changed.wait(), timeout=left)
        except ConnectionResetError:
            pass  # the client closed its watch
        return response

    @staticmethod
    async def gone(request: web.Request, message: str) -> web.StreamResponse:
        """A watch the API server cannot serve from its history: one ERROR event, 410 Expired."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(json.dumps({"type": "ERROR", "object": errors.gone(message).status()}).encode() + b"\n")
        return response

    # -- write -------------------------------------------------------------------------

    def check_namespace(self, target: Target, name: str) -> None:
        """The NamespaceLifecycle admission plugin."""
        if not target.resource.namespaced:
            return
        namespace = self.store.get("namespaces", "", target.namespace)
        if namespace is None:
            raise errors.not_found("namespaces", target.namespace)
        if namespace.get("metadata", {}).get("deletionTimestamp"):
            why = f"unable to create new content in namespace {target.namespace} because it is being terminated"
            raise errors.forbidden(target.plural, name, why, target.group.name)

    async def create_object(self, target: Target, body: Any, dry_run: bool = False) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request was not a JSON object")
        group, resource = target.group, target.resource
        if body.get("apiVersion") not in (None, group.group_version):
            raise errors.bad_request(
                f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                f"({group.group_version})"
            )
        meta = body.setdefault("metadata", {})
        if resource.namespaced and meta.get("namespace") not in (None, "", target.namespace):
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if not meta.get("name") and meta.get("generateName"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(random.choice(alphabet) for _ in range(5))
        name = meta.get("name") or ""
        qualified_kind = f"{resource.kind}.{group.name}" if group.name else resource.kind
        if not name:
            raise errors.invalid(
                qualified_kind,
                "",
                [("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")],
                group.name,
            )
        pattern, longest, rule = NAME_RULES[resource.name_rule]
        if not pattern.match(name) or len(name) > longest:
            why = (
                f'Invalid value: "{name}": {rule}'
                if pattern.match(name) is None
                else f'Invalid value: "{name}": must be no more than {longest} characters'
            )
            raise errors.invalid(qualified_kind, name, [("metadata.name", "FieldValueInvalid", why)], group.name)
        causes = resource.validate(body) if resource.validate else []
        if causes:
            raise errors.invalid(qualified_kind, name, causes, group.name)
        self.check_namespace(target, name)
        if self.store.get(target.key, target.namespace, name) is not None:
            raise errors.already_exists(target.plural, name, group.name)
        for field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        body["kind"], body["apiVersion"] = resource.kind, group.group_version
        if resource.defaults:
            resource.defaults(body)
        if dry_run:
            return body
        await self.store.put(target.key, target.namespace, body, "ADDED")
        if target.key == "namespaces":  # the service-account controller
            account = self._target("", "serviceaccounts", name)
            await self.create_object(account, {"metadata": {"name": "default"}})
        if hook := self.on_created.get(target.key):
            self.spawn(hook(body))
        return body

    def _keep_server_fields(self, target: Target, current: Obj, new: Obj, status_only: bool) -> Obj:
        """What an update may not change: identity, and status (main resource) or all else (status)."""
        if status_only:
            return {**copy.deepcopy(current), "status": new.get("status", current.get("status"))}
        meta = new.setdefault("metadata", {})
        for field in (
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        if "status" in target.resource.subresources:
            new["status"] = copy.deepcopy(current.get("status"))
        if "generation" in meta and new.get("spec") != current.get("spec"):
            meta["generation"] += 1
        new["kind"], new["apiVersion"] = target.resource.kind, target.group.group_version
        return new

    async def _replace(self, target: Target, current: Obj, new: Obj, status_only: bool = False) -> Obj:
        wanted_rv = new.get("metadata", {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(target.plural, target.name, errors.MODIFIED, target.group.name)
        stored = self._keep_server_fields(target, current, new, status_only)
        meta = stored["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self.remove(target.key, target.namespace, target.name)  # the last finalizer is gone
            return stored
        await self.store.put(target.key, target.namespace, stored, "MODIFIED")
        return with_type(stored, target.group, target.resource)

    async def update(self, target: Target, body: Any, status_only: bool = False) -> Obj:
        current = self.store.get(target.key, target.namespace, target.name)
        if current is None:
            raise target.not_found()
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request was not a JSON object")
        named = body.get("metadata", {}).get("name")
        if named != target.name:
            raise errors.bad_request(
                f"the name of the object ({named}) does not match the name on the URL ({target.name})"
            )
        return await self._replace(target, current, body, status_only)

    async def patch(self, target: Target, content_type: str, body: Any, status_only: bool = False) -> Obj:
        current = self.store.get(target.key, target.namespace, target.name)
        if current is None:
            raise target.not_found()
        patched = apply(content_type, copy.deepcopy(current), body)
        precondition = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        patched.setdefault("metadata", {})["resourceVersion"] = precondition or current["metadata"]["resourceVersion"]
        return await self._replace(target, current, patched, status_only)

    async def status_subresource(self, request: web.Request, target: Target) -> web.Response:
        if request.method == "GET":
            return web.json_response(self.read(target))
        if request.method == "PUT":
            return web.json_response(await self.update(target, await self.body(request), status_only=True))
        if request.method == "PATCH":
            return web.json_response(await self.patch(target, request.content_type, await self.body(request), True))
        raise errors.method_not_allowed(request.method)

    # -- delete ------------------------------------------------------------------------

    async def delete(self, target: Target, options: Obj) -> tuple[Obj, bool]:
        """(the answer, whether the deletion is still under way and the client asked to cascade)."""
        obj = self.store.get(target.key, target.namespace, target.name)
        if obj is None:
            raise target.not_found()
        meta = obj["metadata"]
        preconditions = options.get("preconditions") or {}
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if preconditions.get(field) and preconditions[field] != meta.get(field):
                why = (
                    f"Precondition failed: {label} in precondition: {preconditions[field]}, "
                    f"{label} in object meta: {meta.get(field)}"
                )
                raise errors.conflict(target.plural, target.name, why, target.group.name)
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        cascading = options.get("orphanDependents") is False
        if target.key == "namespaces":
            await self.terminate_namespace(obj)
            return with_type(obj, target.group, target.resource), cascading
        if policy == "Orphan":
            await self.orphan(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if finalizers:
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=now(), deletionGracePeriodSeconds=0, finalizers=finalizers)
                await self.store.put(target.key, target.namespace, obj, "MODIFIED")
                if "foregroundDeletion" in finalizers:
                    self.spawn(self.foreground(target.key, target.namespace, obj))
            return with_type(obj, target.group, target.resource), cascading
        if target.key == "pods":
            gone = await self.delete_pod(obj, options.get("gracePeriodSeconds"))
            return with_type(obj, target.group, target.resource), cascading and not gone
        await self.remove(target.key, target.namespace, target.name)
        if target.resource.returns_deleted:
            return with_type(obj, target.group, target.resource), False
        return errors.success(target.plural, target.name, meta["uid"], target.group.name), False

    async def delete_collection(self, request: web.Request, target: Target) -> web.Response:
        wanted = self.selected(request, target)
        deleted = []
        for obj in [o for o in self.store.items(target.key, self.scope(target)) if wanted(o)]:
            one = Target(target.group, target.resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            await self.delete(one, {})
            deleted.append(obj)
        kind = f"{target.resource.kind}List"
        meta = {"resourceVersion": str(self.store.current)}
        return web.json_response(
            {"kind": kind, "apiVersion": target.group.group_version, "metadata": meta, "items": deleted}
        )

    async def delete_pod(self, pod: Obj, grace: int | None) -> bool:
        """A pod's deletion: at once when no kubelet runs it, else graceful (True: gone already)."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        if meta.get("deletionTimestamp"):
            return False  # already terminating
        terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if not spec.get("nodeName") or terminal or grace <= 0:
            await self.stop_pod(pod, 0)
            await self.remove("pods", meta["namespace"], meta["name"])
            return True
        meta.update(deletionTimestamp=stamp(grace), deletionGracePeriodSeconds=grace)
        await self.store.put("pods", meta["namespace"], pod, "MODIFIED")
        self.spawn(self._terminate(pod, grace))
        return False

    async def _terminate(self, pod: Obj, grace: float) -> None:
        """The kubelet stops the containers (TERM, KILL after the grace period), then deletes the pod."""
        await self.stop_pod(pod, grace)
        meta = pod["metadata"]
        current = self.store.get("pods", meta["namespace"], meta["name"])
        if current is not None and current["metadata"]["uid"] == meta["uid"]:
            await self.remove("pods", meta["namespace"], meta["name"])

    async def remove(self, key: str, namespace: str, name: str) -> None:
        """The object leaves the store (DELETED); the garbage collector then looks at its dependents."""
        obj = await self.store.delete(key, namespace, name)
        if obj is not None:
            self.spawn(self.collect(obj["metadata"]["uid"]))
            if hook := self.on_removed.get(key):
                self.spawn(hook(obj))

    def dependents(self, uid: str) -> list[tuple[str, str, Obj]]:
        return [(r, ns, o) for r, ns, o in self.store.everything() if uid in owners(o)]

    def _target_of(self, key: str, namespace: str, obj: Obj) -> Target:
        plural, _, group = key.partition(".")
        target = self._target(group, plural, namespace, obj["metadata"]["name"])
        return target

    async def collect(self, uid: str) -> None:
        """The garbage collector: dependents none of whose owners remain are deleted (in the background)."""
        alive = {o["metadata"]["uid"] for _, _, o in self.store.everything()}
        for key, namespace, obj in self.dependents(uid):
            if not any(owner in alive for owner in owners(obj)):
                with contextlib.suppress(ApiError):
                    await self.delete(self._target_of(key, namespace, obj), {})

    async def orphan(self, uid: str) -> None:
        for key, namespace, obj in self.dependents(uid):
            refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            obj["metadata"]["ownerReferences"] = refs
            await self.store.put(key, namespace, obj, "MODIFIED")

    async def foreground(self, key: str, namespace: str, owner: Obj) -> None:
        """Foreground deletion: the dependents go first, then the owner's finalizer, then the owner."""
        uid = owner["metadata"]["uid"]
        for dep_key, dep_namespace, dep in self.dependents(uid):
            with contextlib.suppress(ApiError):
                await self.delete(self._target_of(dep_key, dep_namespace, dep), {"propagationPolicy": "Foreground"})
        await self.wait_until(lambda: not self.dependents(uid))
        current = self.store.get(key, namespace, owner["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != uid:
            return
        finalizers = [f for f in current["metadata"].get("finalizers") or [] if f != "foregroundDeletion"]
        current["metadata"]["finalizers"] = finalizers
        if finalizers:
            await self.store.put(key, namespace, current, "MODIFIED")
        else:
            await self.remove(key, namespace, current["metadata"]["name"])

    async def terminate_namespace(self, namespace: Obj) -> None:
        """The namespace controller: Terminating, everything in it deleted, then the namespace itself."""
        meta = namespace["metadata"]
        if meta.get("deletionTimestamp"):
            return
        meta["deletionTimestamp"] = now()
        namespace["status"] = {"phase": "Terminating"}
        await self.store.put("namespaces", "", namespace, "MODIFIED")
        self.spawn(self._finalize_namespace(meta["name"], meta["uid"]))

    async def _finalize_namespace(self, name: str, uid: str) -> None:
        def contents() -> list[tuple[str, str, Obj]]:
            return [(r, ns, o) for r, ns, o in self.store.everything() if ns == name and r != "namespaces"]

        for key, namespace, obj in contents():
            with contextlib.suppress(ApiError):
                await self.delete(self._target_of(key, namespace, obj), {})
        await self.wait_until(lambda: not contents())
        current = self.store.get("namespaces", "", name)
        if current is not None and current["metadata"]["uid"] == uid:
            current["spec"]["finalizers"] = []
            await self.remove("namespaces", "", name)

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Wait on the store's changes until done() holds."""
        while not done():
            async with self.store.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.store.changed.wait(), timeout=1)
