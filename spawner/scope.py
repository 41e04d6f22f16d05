"""Whose names a viewer may see: admins everyone, a class's teachers its members. Pure code.

The portal (portal/data/access.py) and the hub's GPU line API (hub/line_api.py) both narrow
what they hand out by it, so a page and an API answer the same question the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from spawner.quotas import GroupRules


@dataclass(frozen=True)
class Scope:
    viewer: str
    everyone: bool = False  # an admin
    users: frozenset[str] = frozenset()  # the viewer and the members of the classes they teach

    def sees(self, user: str) -> bool:
        return self.everyone or user == self.viewer or user in self.users

    @property
    def teaches(self) -> bool:
        return bool(self.users - {self.viewer})


def scope_for(viewer: str, admin: bool, rules: Iterable[GroupRules], groups: Mapping[str, Sequence[str]]) -> Scope:
    """The viewer's scope: a group whose rules list them under ``teachers`` adds its members
    (the hub's group of that name and the rule's own ``members``)."""
    if admin:
        return Scope(viewer, everyone=True)
    users = {viewer}
    for rule in rules:
        if viewer in rule.teachers:
            users |= set(groups.get(rule.name, ())) | set(rule.members)
    return Scope(viewer, users=frozenset(users))
