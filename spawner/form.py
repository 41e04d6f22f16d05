"""The spawn form's HTML: the page data gathered by the spawner, rendered from
``templates/spawn_form.html`` with Jinja2 (autoescape on: names come from admins and users)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import jinja2

from spawner.inventory import Inventory
from spawner.quotas import GroupQuota, Usage
from spawner.shares import GpuRequest, RequestKind, format_bytes, slice_choices
from spawner.sharing import slice_note

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

    gpu_default_image: str
    gpu_default_memory: str

    def launchable_images(self) -> Iterable[FormImage]: ...

    def approved_models(self) -> Iterable[FormModel]: ...

    def selected_models(self) -> set[str]: ...


@dataclass(frozen=True)
class SliceChoice:
    value: str  # what the form posts: "4GiB"
    label: str  # what the user reads: "4 GiB"


def group_limits(group: GroupQuota, usage: Usage) -> str:
    """A group's rules in a sentence: "slices up to 4 GiB; 4 GiB of the class's 8 GiB budget free now"."""
    limits = []
    if group.max_slice_bytes is not None:
        limits.append(f"slices up to {format_bytes(group.max_slice_bytes)}")
    if group.budget_bytes is not None:
        left = max(0, group.budget_bytes - usage.group_bytes.get(group.name, 0))
        budget = format_bytes(group.budget_bytes)
        if left:
            limits.append(f"{format_bytes(left)} of the class's {budget} GPU budget free now")
        else:
            limits.append(f"the class's {budget} GPU budget is all in use now")
    if group.servers_per_user is not None:
        count = group.servers_per_user
        limits.append(f"{count} server{'' if count == 1 else 's'} per person")
    return "; ".join(limits) or "no limits"


@dataclass(frozen=True)
class FormChoice:
    """What the user chose last, to show the form again with it (None: not given)."""

    gpu: str | None = None  # a value of the GPU select: "0", "4GiB", "gpus:2"
    image: str | None = None
    models: frozenset[str] | None = None


WHOLE_PREFIX = "gpus:"


def form_gpu_value(request: GpuRequest, largest_card: int) -> str:
    """The GPU select's value for ``request``: "0", a slice ("4GiB") or whole cards ("gpus:2")."""
    if request.kind is RequestKind.WHOLE:
        return f"{WHOLE_PREFIX}{request.gpus}"
    if request.kind is RequestKind.SLICE:
        return _value(request.bytes_on(largest_card))
    return "0"


def split_gpu_choice(value: str) -> tuple[str, str]:
    """The GPU select's value as the spawn options ``(gpu_memory, gpus)``."""
    if value.startswith(WHOLE_PREFIX):
        return "0", value.removeprefix(WHOLE_PREFIX)
    return value, "0"


def whole_gpus_allowed(groups: list[GroupQuota], most_cards: int, card_bytes: int) -> int:
    """The most whole GPUs any of the user's groups could ever grant one server (0: offer none).

    A group's ``max_gpus`` and its budget both count: a class whose budget is 8 GiB can never
    hold a 16 GiB card, so the form does not offer one.
    """
    if not groups:
        return most_cards

    def allowed(group: GroupQuota) -> int:
        cards = most_cards if group.max_gpus is None else min(group.max_gpus, most_cards)
        if group.budget_bytes is not None and card_bytes:
            cards = min(cards, group.budget_bytes // card_bytes)
        return cards

    return max(allowed(g) for g in groups)


def _whole_gpus(count: str) -> str:
    return f"{count} whole GPU{'' if count == '1' else 's'}"


# API words in refusals -> the labels the form shows. Order matters: the longer phrases first.
_FORM_WORDS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r'ask for gpu_memory "0" \(CPU only\)'), 'choose "No GPU (CPU only)"'),
    (re.compile(r"(ask for )?gpus=1 \(and gpu_memory \"0\"\)"), "choose 1 whole GPU"),
    (re.compile(r"for whole cards with gpus=(\d+)"), lambda m: f"for {_whole_gpus(m.group(1))}"),
    (re.compile(r"for a whole card with gpus=1"), "for 1 whole GPU"),
    (re.compile(r"ask for gpus=(\d+)"), lambda m: f"choose {_whole_gpus(m.group(1))}"),
    (re.compile(r"gpus=(\d+)"), lambda m: _whole_gpus(m.group(1))),
    (re.compile(r"\bgpu_memory\b"), "GPU memory"),
    (re.compile(r"\bgpus\b(?! \()"), "whole GPUs"),
    # The form has no box to type in: what to type becomes what to choose.
    (re.compile(r"[;,]? [Tt]ype\b.*$"), ". Choose a size from the GPU list."),
    (re.compile(r"^[Tt]ype\b.*$"), "Choose a size from the GPU list."),
)


def in_form_words(message: str) -> str:
    """A refusal written for the REST API (gpus=2, gpu_memory) in the words the form shows."""
    for pattern, words in _FORM_WORDS:
        message = pattern.sub(words, message)
    return message


def _value(size: int) -> str:
    return format_bytes(size).replace(" ", "")


def _default_gpu(source: FormSource, groups: list[GroupQuota], slices: list[int], ceiling: int) -> str:
    """The class's slice, else the configured default, else the smallest slice offered; CPU only last."""
    offered = {_value(c) for c in slices}
    for group in groups:
        if group.max_slice_bytes is not None and _value(min(group.max_slice_bytes, ceiling)) in offered:
            return _value(min(group.max_slice_bytes, ceiling))
    configured = source.gpu_default_memory.replace(" ", "")
    if configured in offered:
        return configured
    return _value(slices[0]) if slices else "0"


def _slice_label(size: int, startable_now: int) -> str:
    """ "4 GiB of one GPU", marked when none can start now: Start then waits in line for it."""
    words = f"{format_bytes(size)} of one GPU"
    return words if size <= startable_now else f"{words} (busy now: Start joins the line)"


def render_spawn_form(
    source: FormSource,
    inventory: Inventory,
    groups: list[GroupQuota],
    usage: Usage,
    *,
    allowed: int,
    startable_now: int,
    most_cards: int,
    simulated: bool,
    previous: FormChoice | None = None,
) -> str:
    """The form: GPUs with free memory, the user's group rules, and every choice the rules can grant.

    ``allowed``: the largest slice the user's rules could ever grant (what is offered);
    ``startable_now``: the largest that would start now (the larger ones are marked: Start
    waits in line for them). ``most_cards``: whole GPUs the rules can grant (0: none offered).
    ``simulated``: no NVIDIA GPU here, the GPUs are simulated. ``previous``: the choices to
    keep (the form shown again after a refusal).
    """
    previous = previous or FormChoice()
    sizes = sorted(set(slice_choices(allowed)) | {min(g.max_slice_bytes, allowed) for g in groups if g.max_slice_bytes})
    sizes = [s for s in sizes if s > 0]
    wholes = [f"{WHOLE_PREFIX}{n}" for n in range(1, most_cards + 1)]
    offered = {"0", *wholes, *(_value(c) for c in sizes)}
    chosen_gpu = previous.gpu if previous.gpu in offered else _default_gpu(source, groups, sizes, allowed)
    slices = [SliceChoice(_value(c), _slice_label(c, startable_now)) for c in sizes]
    images = sorted(source.launchable_images(), key=lambda i: i.slug)
    chosen_image = previous.image if previous.image in {i.slug for i in images} else source.gpu_default_image
    return _TEMPLATES.get_template("spawn_form.html").render(
        simulated=simulated,
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
        slices=slices,
        some_wait=any(c > startable_now for c in sizes),
        wholes=[SliceChoice(w, _whole_gpus(str(n))) for n, w in enumerate(wholes, start=1)],
        chosen_gpu=chosen_gpu,
        images=images,
        default_image=chosen_image,
        models=list(source.approved_models()),
        chosen_models=previous.models if previous.models is not None else source.selected_models(),
        slice_note=(inventory.slice_note or slice_note(inventory.backend)) if slices else "",
    )
