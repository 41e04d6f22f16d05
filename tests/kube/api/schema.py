"""What the double knows of a resource: its names, scope, verbs, subresources and defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
READ_ONLY = ("get", "list", "watch")


@dataclass(frozen=True)
class Resource:
    """One resource of a group, as its discovery document and its REST strategy describe it."""

    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = VERBS
    # Subresources served, each a path segment after the name (status, binding, exec, log ...).
    subresources: tuple[str, ...] = ()
    # Field selectors it supports besides metadata.name and metadata.namespace.
    fields: tuple[str, ...] = ()
    # What the API server fills in on create (the group's defaulting and PrepareForCreate).
    defaults: Callable[[Obj], None] | None = None
    # The group's validation of a new object: (field, reason, message) for each fault.
    validate: Callable[[Obj], list[tuple[str, str, str]]] | None = None
    # Whether DELETE answers with the object (pods, namespaces) or with a Status.
    returns_deleted: bool = False
    # The name's rule: "subdomain" (RFC 1123 subdomain), "label" (RFC 1123 label) or "label1035".
    name_rule: str = "subdomain"

    @property
    def singular(self) -> str:
        return self.kind.lower()


@dataclass(frozen=True)
class Group:
    """An API group at one version: "" is the core group served under /api/v1."""

    name: str
    version: str
    resources: tuple[Resource, ...] = field(default_factory=tuple)

    @property
    def group_version(self) -> str:
        return f"{self.name}/{self.version}" if self.name else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.name}/{self.version}" if self.name else f"/api/{self.version}"

    def key(self, resource: Resource) -> str:
        """The store's name for a resource: the plural, qualified by the group outside the core group."""
        return f"{resource.plural}.{self.name}" if self.name else resource.plural

    def resource(self, plural: str) -> Resource | None:
        return next((r for r in self.resources if r.plural == plural), None)
