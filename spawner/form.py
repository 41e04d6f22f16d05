"""The spawn form's HTML: the page data gathered by the spawner, rendered from
``templates/spawn_form.html`` with Jinja2 (autoescape on: names come from admins and users)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import jinja2

from spawner.inventory import Inventory
from spawner.quotas import GroupQuota, Usage
from spawner.shares import GiB, format_bytes

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("spawner", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


class FormImage(Protocol):
    @property
    def slug(self) -> str: ...
    @property
    def description(self) -> str: ...


class FormModel(Protocol):
    @property
    def slug(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def license(self) -> str: ...


class FormSource(Protocol):
    """What the form needs from the spawner (``GpuShareMixin`` provides it)."""

    gpu_max_cards: int
    gpu_default_image: str

    def launchable_images(self) -> Iterable[FormImage]: ...

    def approved_models(self) -> Iterable[FormModel]: ...

    def selected_models(self) -> set[str]: ...


@dataclass(frozen=True)
class SliceChoice:
    value: str  # what the form posts: "4GiB"
    label: str  # what the user reads: "4 GiB"


def slice_choices(ceiling: int) -> list[int]:
    """Slice sizes to offer: powers of two from 0.5 GiB up to ``ceiling``, and the ceiling itself."""
    choices, size = [], GiB // 2
    while size <= ceiling:
        choices.append(size)
        size *= 2
    if ceiling and (not choices or choices[-1] != ceiling):
        choices.append(ceiling)
    return choices


def group_limits(group: GroupQuota, usage: Usage) -> str:
    """A group's rules in a sentence: "slices up to 4 GiB, 36 GiB of the group's 40 GiB budget left"."""
    limits = []
    if group.max_slice_bytes is not None:
        limits.append(f"slices up to {format_bytes(group.max_slice_bytes)}")
    if group.budget_bytes is not None:
        left = max(0, group.budget_bytes - usage.group_bytes.get(group.name, 0))
        limits.append(f"{format_bytes(left)} of the group's {format_bytes(group.budget_bytes)} budget left")
    if group.servers_per_user is not None:
        limits.append(f"{group.servers_per_user} server(s) per person")
    return ", ".join(limits) or "no limits"


def render_spawn_form(
    source: FormSource,
    inventory: Inventory,
    groups: list[GroupQuota],
    usage: Usage,
    ceiling: int,
    gpu_count: int,
    simulated_source: str | None,
) -> str:
    """The form: GPUs with free memory, the user's group rules, and the choices allowed now.

    ``simulated_source`` says why the GPUs are simulated ("NVML: no driver"); None on real GPUs.
    """
    max_cards = source.gpu_max_cards or gpu_count
    return _TEMPLATES.get_template("spawn_form.html").render(
        simulated_source=simulated_source,
        gpus=[
            {
                "index": g.index,
                "model": g.model,
                "simulated": g.simulated,
                "free": format_bytes(g.free_bytes),
                "total": format_bytes(g.memory_bytes),
            }
            for g in inventory.gpus()
        ],
        groups=[{"name": g.name, "limits": group_limits(g, usage)} for g in groups],
        slices=[SliceChoice(format_bytes(c).replace(" ", ""), format_bytes(c)) for c in slice_choices(ceiling)],
        cards=range(0, max_cards + 1),
        images=sorted(source.launchable_images(), key=lambda i: i.slug),
        default_image=source.gpu_default_image,
        models=list(source.approved_models()),
        chosen_models=source.selected_models(),
    )
