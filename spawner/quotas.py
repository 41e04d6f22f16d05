"""Per-group rules for classes: slice size, group budget, servers per user, images.

Pure code. A user may belong to several groups (a student in two classes, a
teaching assistant who is also staff). A request is checked against every group of
the user; it is granted under the first group, in the order the groups are
configured, whose rules it meets all of, and that group's budget is charged. When no
group grants it, the refusal names each group's failing rule with the numbers.
Users in no configured group get ``default`` rules (unlimited unless configured).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spawner.shares import GpuRequest, RequestKind, ShareError, format_bytes, parse_quantity


@dataclass(frozen=True)
class GroupQuota:
    """The rules of one group; ``None`` means no limit."""

    name: str
    max_slice_bytes: int | None = None  # largest slice one server may hold
    max_gpus: int | None = None  # most whole cards one server may hold
    budget_bytes: int | None = None  # GPU memory the whole group may hold at once
    servers_per_user: int | None = None  # running servers per member
    allowed_images: frozenset[str] | None = None  # image-market ids; None: any


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


UNLIMITED = GroupQuota("default")


def check(
    request: GpuRequest,
    slice_bytes: int,
    image: str | None,
    groups: Sequence[GroupQuota],
    usage: Usage,
) -> QuotaDecision:
    """Is ``request`` (taking ``slice_bytes`` of GPU memory in all) within a group's rules?"""
    candidates = list(groups) or [UNLIMITED]
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
            f"{label} allows {group.servers_per_user} running server(s) per user and you have "
            f"{usage.user_servers}; stop one first."
        )
    if request.kind is RequestKind.WHOLE:
        if group.max_gpus is not None and request.gpus > group.max_gpus:
            limit = f"at most {group.max_gpus} whole GPU(s)" if group.max_gpus else "no whole GPUs"
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
    for group in list(groups) or [UNLIMITED]:
        limit = card_bytes if group.max_slice_bytes is None else min(card_bytes, group.max_slice_bytes)
        left = remaining(group, usage)
        if left is not None:
            limit = min(limit, left)
        if group.servers_per_user is not None and usage.user_servers >= group.servers_per_user:
            limit = 0
        best = max(best, limit)
    return best


# A group's rules as written in settings and in the chart's values (camelCase there, as
# Helm values are: maxSlice); ``members`` and ``profiles`` say who is in the group.
GROUP_RULE_KEYS = ("members", "teachers", "profiles", "max_slice", "max_gpus", "budget", "servers_per_user", "images")


class GroupRulesError(ValueError):
    """Group rules that cannot be used; the message names the group and the key."""


def rule_key(key: str) -> str:
    """A rule's key in settings spelling: the chart's ``maxSlice`` is ``max_slice``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


def group_rules(name: str, raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """One group's rules checked, keys in settings spelling; GroupRulesError says what is wrong.

    The one parser of group rules: settings files, the chart's values and ``group_quota``
    all come through here.
    """
    where = f"groups.{name}"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise GroupRulesError(f"{where} must be a mapping of rules")
    rules = {rule_key(str(k)): v for k, v in raw.items()}
    unknown = sorted(set(rules) - set(GROUP_RULE_KEYS))
    if unknown:
        raise GroupRulesError(f"{where}: {unknown_keys_message(unknown, GROUP_RULE_KEYS)}")
    for key in ("max_slice", "budget"):
        if rules.get(key) is not None:
            try:
                size_rule(str(rules[key]), None if key == "max_slice" else rules.get("max_slice"))
            except ShareError as exc:
                raise GroupRulesError(f"{where}.{key}: {exc}") from None
    for key in ("max_gpus", "servers_per_user"):
        value = rules.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise GroupRulesError(f"{where}.{key} must be a whole number, 0 or more")
    for key in ("members", "teachers", "profiles", "images"):
        value = rules.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(m, str) for m in value)):
            raise GroupRulesError(
                f"{where}.{key} must be a list of {'user names' if key in ('members', 'teachers') else 'names'}"
            )
    return {**rules, "members": rules.get("members") or []}


_SLICES = re.compile(r"^\s*(\d+)\s+slices?(?:\s+of\s+(.+?))?\s*$", re.IGNORECASE)


def size_rule(text: str, max_slice: Any = None) -> int:
    """A size rule in bytes: "8GiB", or a budget in slices: "2 slices of 4 GiB", or "2 slices" of the
    class's ``max_slice``; ShareError saying how to write it."""
    counted = _SLICES.match(text)
    if not counted:
        return parse_quantity(text.replace(" ", ""))
    count, of = int(counted.group(1)), counted.group(2) or (str(max_slice) if max_slice is not None else None)
    if of is None:
        raise ShareError(f'{text!r} says how many slices but not of what size: write "{count} slices of 4GiB"')
    return count * parse_quantity(of.replace(" ", ""))


def group_quota(raw: Mapping[str, Any]) -> GroupQuota:
    """A group's quota from its rules and ``name`` (sizes as text, "4GiB"; lists of images)."""
    name = str(raw["name"])
    rules = group_rules(name, {k: v for k, v in raw.items() if k != "name"})

    def size(key: str) -> int | None:
        slice_rule = None if key == "max_slice" else rules.get("max_slice")
        return None if rules.get(key) is None else size_rule(str(rules[key]), slice_rule)

    images = rules.get("images")
    return GroupQuota(
        name=name,
        max_slice_bytes=size("max_slice"),
        max_gpus=rules.get("max_gpus"),
        budget_bytes=size("budget"),
        servers_per_user=rules.get("servers_per_user"),
        allowed_images=None if images is None else frozenset(images),
    )


def unknown_keys_message(unknown: Sequence[str], known: Sequence[str]) -> str:
    """ "unknown key(s) colr (did you mean colour?); use ...": a typo gets its likely fix."""
    guesses = [
        f"{k} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(k, known, 1)) else k for k in unknown
    ]
    return f"unknown key(s) {', '.join(guesses)}; use {', '.join(sorted(known))}"
