"""Whose names and servers a viewer may see: admins everyone, a class's teachers its members.

Everyone else sees their own servers and slices and aggregate numbers: other people's
allocations keep their size (so totals stay true) but lose the name, the server and the
ledger key. Every source that returns people's data goes through here, so a page cannot
show what the data layer did not hand it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from portal.identity import Identity
from spawner.inventory import Allocation, Inventory
from spawner.ledger import Held, ServerEvent
from spawner.quotas import GroupRules
from spawner.scope import Scope as Scope  # re-exported: the portal names it from here
from spawner.scope import scope_for

HIDDEN = ""  # the user name of an allocation the viewer may not see


def scope_of(identity: Identity, rules: Iterable[GroupRules], groups: Mapping[str, Sequence[str]]) -> Scope:
    """The identity's scope: a group whose rules list them under ``teachers`` adds its members."""
    return scope_for(identity.name, identity.admin, rules, groups)


def holds(held: Iterable[Held], scope: Scope) -> list[Held]:
    return [h if scope.sees(h.user) else replace(h, key=HIDDEN, user=HIDDEN, server="", pid=None) for h in held]


def _allocation(allocation: Allocation, scope: Scope) -> Allocation:
    return allocation if scope.sees(allocation.user) else replace(allocation, user=HIDDEN, server="", owner="")


def inventory(found: Inventory, scope: Scope) -> Inventory:
    """The inventory with the allocations of people outside the scope made anonymous."""
    if scope.everyone:
        return found
    nodes = [
        replace(node, gpus=[replace(g, allocations=[_allocation(a, scope) for a in g.allocations]) for g in node.gpus])
        for node in found.nodes
    ]
    return replace(found, nodes=nodes)


def events(latest: Mapping[str, ServerEvent], scope: Scope) -> dict[str, ServerEvent]:
    return {key: e for key, e in latest.items() if scope.sees(key.split("/", 1)[0])}


def require(scope: Scope, user: str, what: str) -> None:
    """PermissionError unless the viewer may see ``user``'s ``what``."""
    if not scope.sees(user):
        raise PermissionError(
            f"{scope.viewer} may not read {user}'s {what}: only admins and the teachers of {user}'s class can"
        )
