"""The double's etcd: objects by (resource, namespace, name), one resourceVersion counter, a watch log."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
HISTORY = 1000  # watch events kept; older resourceVersions are Gone


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """``resource`` is the registry's key: the plural in the core group, ``plural.group`` elsewhere."""

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
        """Store obj (a new resourceVersion) and log it as a watch event of type kind (ADDED, MODIFIED)."""
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

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((resource, namespace, name))

    def items(self, resource: str, namespace: str | None) -> list[Obj]:
        return [o for (r, ns, _), o in self.objects.items() if r == resource and (namespace is None or ns == namespace)]

    def everything(self) -> list[tuple[str, str, Obj]]:
        """(resource, namespace, object) of every stored object."""
        return [(r, ns, o) for (r, ns, _), o in self.objects.items()]
