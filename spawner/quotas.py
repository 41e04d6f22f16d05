"""Per-group rules for classes: slice size, group budget, servers per user, images, longest hold.

Pure code. A user may belong to several groups (a student in two classes, a
teaching assistant who is also staff). A request is checked against every group of
the user; it is granted under the first group, in the order the groups are
configured, whose rules it meets all of, and that group's budget is charged. When no
group grants it, the refusal names each group's failing rule with the numbers.

Users in no configured group get the ``default`` rules: finite (``DEFAULT_RULES``: a
4 GiB slice at most, no whole cards, one server, 16 GiB for all of them together),
changed by a group named ``default`` in the settings (the keys it leaves out keep
these values). A second account made outside a class therefore never gets more than
a small slice.

Group rules are written in three places (gpuslice.yaml's ``groups``, the chart's
``groups`` in camelCase, Zero to JupyterHub's ``KubeGpuSpawner.gpu_groups``) and read by
one model, ``GroupRules``; ``GroupRules.quota`` is what ``check`` applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError, WithJsonSchema, field_validator, model_validator

from sizes import SizeError, parse_quantity
from spawner.checked import (
    AMOUNT_PATTERN,
    Checked,
    Count,
    Duration,
    Limit,
    Names,
    UserNames,
    duration_seconds,
    one_of,
    problems,
)
from spawner.shares import GpuRequest, RequestKind, format_bytes
from spawner.words import counted


@dataclass(frozen=True)
class GroupQuota:
    """The rules of one group; ``None`` means no limit."""

    name: str
    max_slice_bytes: int | None = None  # largest slice one server may hold
    max_gpus: int | None = None  # most whole cards one server may hold
    budget_bytes: int | None = None  # GPU memory the whole group may hold at once
    servers_per_user: int | None = None  # running servers per member
    allowed_images: frozenset[str] | None = None  # image-market ids; None: any
    max_hold_s: float | None = None  # while others wait for a GPU: longest one server may hold its slice


@dataclass(frozen=True)
class Usage:
    """What is held now: the user's running servers and each group's GPU memory."""

    user_servers: int = 0
    group_bytes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaDecision:
    allowed: bool
    group: str | None  # the group charged, when allowed
    reasons: tuple[str, ...] = ()  # why each group refused, when not allowed
    rule: str = ""  # the first failing rule's key, for metrics ("slice", "budget", ...)

    def __str__(self) -> str:
        if self.allowed:
            return f"allowed under group {self.group!r}" if self.group else "allowed"
        return " ".join(self.reasons)


def check(
    request: GpuRequest,
    slice_bytes: int,
    image: str | None,
    groups: Sequence[GroupQuota],
    usage: Usage,
) -> QuotaDecision:
    """Is ``request`` (taking ``slice_bytes`` of GPU memory in all) within a group's rules?"""
    candidates = list(groups) or [DEFAULT_RULES.quota]
    reasons: list[str] = []
    first_rule = ""
    for group in candidates:
        failure = _first_failure(group, request, slice_bytes, image, usage)
        if failure is None:
            return QuotaDecision(True, group.name)
        rule, text = failure
        first_rule = first_rule or rule
        reasons.append(text)
    return QuotaDecision(False, None, tuple(reasons), first_rule)


def _first_failure(
    group: GroupQuota, request: GpuRequest, slice_bytes: int, image: str | None, usage: Usage
) -> tuple[str, str] | None:
    label = f"Group {group.name!r}"
    if group.allowed_images is not None and image is not None and image not in group.allowed_images:
        allowed = ", ".join(sorted(group.allowed_images)) or "none"
        return "image", f"{label} does not allow image {image!r} (allowed: {allowed})."
    if group.servers_per_user is not None and usage.user_servers >= group.servers_per_user:
        return "servers", (
            f"{label} allows {counted(group.servers_per_user, 'running server')} per user and you have "
            f"{usage.user_servers}; stop one first."
        )
    if request.kind is RequestKind.WHOLE:
        if group.max_gpus is not None and request.gpus > group.max_gpus:
            limit = f"at most {counted(group.max_gpus, 'whole GPU')}" if group.max_gpus else "no whole GPUs"
            return "gpus", f"{label} allows {limit} per server; you asked for {request.gpus}."
    elif (
        request.kind is RequestKind.SLICE and group.max_slice_bytes is not None and slice_bytes > group.max_slice_bytes
    ):
        return "slice", (
            f"{label} allows slices up to {format_bytes(group.max_slice_bytes)}; "
            f"you asked for {format_bytes(slice_bytes)}. Ask for {format_bytes(group.max_slice_bytes)} or less."
        )
    if group.budget_bytes is not None and slice_bytes:
        held = usage.group_bytes.get(group.name, 0)
        left = max(0, group.budget_bytes - held)
        budget, asked = format_bytes(group.budget_bytes), format_bytes(slice_bytes)
        if slice_bytes > group.budget_bytes:
            return "budget", f"{label} has a GPU budget of {budget} in all, less than the {asked} you asked for."
        if slice_bytes > left and not left:
            return "budget", (
                f"{label}'s GPU budget of {budget} is all in use by its members now."
                " Wait for classmates to stop their servers."
            )
        if slice_bytes > left:
            held_text, left_text = format_bytes(held), format_bytes(left)
            return "budget", (
                f"{label}'s GPU budget is {budget} and its members hold {held_text}: {left_text} left,"
                f" less than the {asked} you asked for. Ask for {left_text} or less."
            )
    return None


def remaining(group: GroupQuota, usage: Usage) -> int | None:
    """GPU memory the group may still take (None: no budget)."""
    if group.budget_bytes is None:
        return None
    return max(0, group.budget_bytes - usage.group_bytes.get(group.name, 0))


def largest_slice(groups: Sequence[GroupQuota], usage: Usage, card_bytes: int) -> int:
    """The largest slice any of the user's groups would grant now (for the spawn form)."""
    best = 0
    for group in list(groups) or [DEFAULT_RULES.quota]:
        limit = card_bytes if group.max_slice_bytes is None else min(card_bytes, group.max_slice_bytes)
        left = remaining(group, usage)
        if left is not None:
            limit = min(limit, left)
        if group.servers_per_user is not None and usage.user_servers >= group.servers_per_user:
            limit = 0
        best = max(best, limit)
    return best


_SLICES = re.compile(r"^\s*(\d+)\s+slices?(?:\s+of\s+(.+?))?\s*$", re.IGNORECASE)
SLICES_PATTERN = r"^\s*[0-9]+\s+[sS][lL][iI][cC][eE][sS]?(\s+[oO][fF]\s+.+)?\s*$"  # as JSON schema (no flags)


def size_rule(text: str, max_slice: str | None = None) -> int:
    """A size rule in bytes: "8GiB", or a budget in slices: "2 slices of 4 GiB", or "2 slices" of the
    group's ``max_slice``; SizeError saying how to write it."""
    counted = _SLICES.match(text)
    if not counted:
        return parse_quantity(text)
    count, of = int(counted.group(1)), counted.group(2) or max_slice
    if of is None:
        raise SizeError(f'{text!r} says how many slices but not of what size: write "{count} slices of 4GiB"')
    return count * parse_quantity(of)


def _budget(value: Any) -> Any:
    """A budget as an amount of memory or in slices ("2 slices", "2 slices of 4 GiB"); 0 allowed: none."""
    if value is None:
        return None
    counted = _SLICES.match(str(value))
    try:
        if counted is None:
            parse_quantity(str(value))
        elif counted.group(2):
            parse_quantity(counted.group(2))
    except SizeError as exc:
        raise ValueError(str(exc)) from None
    return str(value)


Budget = Annotated[
    str | None,
    BeforeValidator(_budget),
    WithJsonSchema({"type": "string", "anyOf": [{"pattern": AMOUNT_PATTERN}, {"pattern": SLICES_PATTERN}]}),
]


class GroupRulesError(ValueError):
    """Group rules that cannot be used; the message names the group and the key."""


DEFAULT_GROUP = "default"  # the group whose rules hold for users in no other group
ROUND_ROBIN, LEAST_SERVED = "round-robin", "least-served"
LINE_ORDERS = (ROUND_ROBIN, LEAST_SERVED)


def rule_key(key: str) -> str:
    """A rule's key in settings spelling: the chart's ``maxSlice`` is ``max_slice``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


class GroupRules(Checked):
    """One group's rules as people write them (sizes as text, "4GiB"); ``None``: no limit.

    The chart's camelCase keys (``maxSlice``) are read as their settings spelling.
    """

    not_keys = ("name",)

    name: str
    members: UserNames = ()
    teachers: UserNames = ()
    profiles: Names = ()  # KubeSpawner profiles this group may choose (Kubernetes)
    max_slice: Limit = None
    max_gpus: Count = None
    budget: Budget = None  # an amount of memory, or slices: "2 slices" (of max_slice), "2 slices of 4GiB"
    servers_per_user: Count = None
    images: Names | None = None  # image-market ids; None: any
    max_hold: Duration = None  # while others wait for a GPU: longest one server holds its slice (2h, 90min, s)
    # The GPU line's order for the class's requests: round-robin between users then arrival, or, with
    # least-served, each second a member held a GPU today counting as a second later (spawner/waitline.py).
    line_order: one_of(*LINE_ORDERS) = ROUND_ROBIN  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _settings_spelling(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {rule_key(str(k)): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _slices_of_a_size(self) -> GroupRules:
        if self.budget is not None and self.max_slice is None:
            try:
                size_rule(self.budget)
            except SizeError as exc:
                raise ValueError(f"budget: {exc}, or set max_slice") from None
        return self

    @field_validator("members", "teachers")
    @classmethod
    def _nobody_in_default(cls, names: tuple[str, ...], info: Any) -> tuple[str, ...]:
        if names and info.data.get("name") == DEFAULT_GROUP:
            raise ValueError(f"must be empty: the {DEFAULT_GROUP} group's rules hold for users in no other group")
        return names

    @property
    def quota(self) -> GroupQuota:
        """The rules in bytes, as ``check`` applies them."""

        def size(text: str | None) -> int | None:
            return None if text is None else parse_quantity(text)

        return GroupQuota(
            name=self.name,
            max_slice_bytes=size(self.max_slice),
            max_gpus=self.max_gpus,
            budget_bytes=None if self.budget is None else size_rule(self.budget, self.max_slice),
            servers_per_user=self.servers_per_user,
            allowed_images=None if self.images is None else frozenset(self.images),
            max_hold_s=None if self.max_hold is None else duration_seconds(self.max_hold),
        )


def least_served_groups(rules: Iterable[GroupRules]) -> frozenset[str]:
    """The classes whose line puts who held least today first (``line_order: least-served``)."""
    return frozenset(r.name for r in rules if r.line_order == LEAST_SERVED)


# Users in no group: a small slice, no whole cards, one server, a budget for all of them together.
DEFAULT_RULES = GroupRules(name=DEFAULT_GROUP, max_slice="4GiB", max_gpus=0, budget="16GiB", servers_per_user=1)
GROUP_RULE_KEYS = GroupRules.keys()


def read_group(name: str, raw: Any) -> GroupRules:
    """One group's rules (``raw`` from a settings file or the chart's values); GroupRulesError says what is wrong."""
    if isinstance(raw, GroupRules):
        return raw
    where = f"groups.{name}"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise GroupRulesError(f"{where} must be a mapping of rules")
    try:
        rules = GroupRules.model_validate({**raw, "name": name})
    except ValidationError as exc:
        raise GroupRulesError(problems(exc, where)) from None
    if name == DEFAULT_GROUP:  # the keys the settings leave out keep the built-in defaults
        written = rules.model_dump(include=rules.model_fields_set)
        rules = GroupRules.model_validate({**DEFAULT_RULES.model_dump(), **written})
    return rules


def read_groups(raw: Any) -> tuple[GroupRules, ...]:
    """Every group: a mapping of names to rules (settings, the chart), or a list of rules with a name (z2jh)."""
    if isinstance(raw, Mapping):
        return tuple(read_group(str(name), rules) for name, rules in raw.items())
    if isinstance(raw, list | tuple):
        return tuple(_named(entry) for entry in raw)
    raise GroupRulesError("groups must map group names to their rules")


def _named(entry: Any) -> GroupRules:
    if isinstance(entry, GroupRules):
        return entry
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise GroupRulesError(f"each group's rules need a name: {entry!r}")
    return read_group(entry["name"], {k: v for k, v in entry.items() if k != "name"})


def default_rules(groups: Iterable[GroupRules]) -> GroupRules:
    """The rules of users in no group: the settings' ``default`` group, else ``DEFAULT_RULES``."""
    return next((g for g in groups if g.name == DEFAULT_GROUP), DEFAULT_RULES)


def classes(groups: Iterable[GroupRules]) -> tuple[GroupRules, ...]:
    """The groups people belong to (every group but ``default``)."""
    return tuple(g for g in groups if g.name != DEFAULT_GROUP)


def rules_for(user_groups: Iterable[str], groups: Sequence[GroupRules]) -> list[GroupRules]:
    """The rules that hold for a member of ``user_groups``: theirs in configured order, else the default."""
    mine = set(user_groups)
    return [g for g in classes(groups) if g.name in mine] or [default_rules(groups)]


def budgets(groups: Sequence[GroupRules]) -> dict[str, int | None]:
    """Each group's GPU budget in bytes by name, the default's included (None: no budget)."""
    return {g.quota.name: g.quota.budget_bytes for g in (*classes(groups), default_rules(groups))}
