"""A job as the platform accepts it: checked against the same rules as its owner's servers, planned once.

``plan_job`` reads a ``JobSpec`` with its owner's spawner (the hub's, for the job's owner): the GPU
request as a server's (spawner/request.py, the smallest slice, the machine's cards), the image
and models from the markets (spawner/images.py: unknown, deprecated, not for this class, not
installed), the class's rules (spawner/quotas.py: the largest slice, whole cards, images; the
budget is the line's to keep, and a request larger than the whole budget or than any machine
could hold is refused, as a waiting server's is), the memory and CPU it may have, and where its
notebook is. Anything wrong is a ``GpuRefused`` (400, 403 or 409) saying what to ask instead,
before anything is written: a refused job leaves nothing behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from spawner.inventory import Inventory
from spawner.jobs import JobPlan, JobSpec, notebook_path
from spawner.mixin import asked_bytes
from spawner.placement import Demand
from spawner.quotas import GroupQuota, Usage, budgets, check
from spawner.request import GpuRefused, read_request
from spawner.shares import GpuRequest, format_bytes, parse_quantity
from spawner.waitline import Entry, never_fits


class JobSpawner(Protocol):
    """What planning a job takes from its owner's spawner (LocalGpuSpawner, KubeGpuSpawner)."""

    gpu_default_memory: str
    gpu_max_cards: int
    gpu_smallest_slice: str
    gpu_option_keys: Any
    gpu_group_rules: Any

    def _quota_groups(self) -> list[GroupQuota]: ...
    def _chosen_image(self, slug: Any) -> str: ...
    def gpu_model_folders(self, wanted: list[str] | None = None) -> dict[str, Path]: ...
    def form_state(self) -> tuple[Inventory, Usage]: ...
    def job_place(self, image: str, group: str | None) -> JobPlace: ...


@dataclass(frozen=True)
class JobPlace:
    """Where a backend runs a job of its owner: the image's environment or container, the home, the account,
    the memory its class allows (None: no limit here), and whether a notebook's presence can be checked now.

    ``limits_in_plan``: the job's plan carries the class's memory and CPU limits when it asks for none (on
    Kubernetes nothing else gives its pod any; on one machine its cgroup takes the class's at its start)."""

    target: str
    home: Path
    account: str = ""
    memory_limit_bytes: int | None = None
    sees_home: bool = True
    cpu_limit: float | None = None  # the cores its class allows (None: no limit here)
    limits_in_plan: bool = False


def _request(spawner: JobSpawner, spec: JobSpec, inventory: Inventory) -> GpuRequest:
    cards = tuple(inventory.gpus())
    options = {"gpu_memory": spec.gpu_memory, "gpus": spec.gpus}
    return read_request(
        options,
        spawner.gpu_default_memory,
        cards,
        spawner.gpu_max_cards,
        frozenset(options),
        parse_quantity(spawner.gpu_smallest_slice),
    )


def _class_charged(spawner: JobSpawner, spec: JobSpec, request: GpuRequest, image: str, asked: int) -> str | None:
    """The class charged for the job, by its rules less the budget (the line keeps that); 403 with why not."""
    rules = [replace(q, budget_bytes=None, servers_per_user=None) for q in spawner._quota_groups()]
    decision = check(request, asked, image, rules, Usage())
    if not decision.allowed:
        raise GpuRefused(403, str(decision), "quota")
    return decision.group


def _notebook_inside(home: Path, text: str) -> None:
    """400 unless the notebook is a file in ``home``, wherever its links lead."""
    relative = notebook_path(text)
    where = (home / relative).resolve()
    if not where.is_relative_to(home.resolve()):
        raise GpuRefused(400, f"The notebook {text} leads out of your home folder; give one inside it.", "invalid")
    if not where.is_file():
        raise GpuRefused(400, f"There is no notebook {text} in your home folder; give its path from there.", "invalid")


def plan_job(spawner: JobSpawner, spec: JobSpec) -> JobPlan:
    """What the platform makes of ``spec`` for its owner; GpuRefused (nothing written) when it cannot run."""
    inventory, _ = spawner.form_state()
    request = _request(spawner, spec, inventory)
    image = spawner._chosen_image(spec.image)
    models = spawner.gpu_model_folders(list(spec.models))
    asked = asked_bytes(request, inventory)
    group = _class_charged(spawner, spec, request, image, asked)
    user = str(getattr(getattr(spawner, "user", None), "name", ""))
    entry = Entry("", user, Demand.from_request(request), asked, group, 0.0)
    why = never_fits(entry, inventory, budgets(spawner.gpu_group_rules)) if request.gpus or asked else None
    if why:
        raise GpuRefused(409, f"{request.describe()} cannot run here: {why}.", "capacity")
    place = spawner.job_place(image, group)
    memory, cpus = job_resources(spec, place, os.cpu_count() or 1)
    if spec.notebook is not None and place.sees_home:
        _notebook_inside(place.home, spec.notebook)
    return JobPlan(
        request_gpus=request.gpus,
        request_memory_bytes=request.memory_bytes,
        request_fraction=request.fraction,
        label=request.describe(),
        image=image,
        target=place.target,
        group=group,
        asked_bytes=asked,
        home=str(place.home),
        account=place.account,
        models={slug: str(folder) for slug, folder in models.items()},
        memory_bytes=memory,
        cpus=cpus,
    )


def job_resources(spec: JobSpec, place: JobPlace, cores: int) -> tuple[int | None, float | None]:
    """The memory and CPU cores a job runs with: what it asked for within its class's limits (400 above them),
    else, where ``place`` says so, the class's limits (a pod without them could take its node's)."""
    memory = parse_quantity(spec.memory) if spec.memory else None
    if memory is not None and place.memory_limit_bytes is not None and memory > place.memory_limit_bytes:
        most = format_bytes(place.memory_limit_bytes)
        raise GpuRefused(400, f"A job may have up to {most} of memory here; ask for {most} or less.", "invalid")
    if spec.cpus is not None and spec.cpus > cores:
        raise GpuRefused(400, f"This machine has {cores} CPU cores; ask for {cores} or fewer.", "invalid")
    if not place.limits_in_plan:
        return memory, spec.cpus
    return memory or place.memory_limit_bytes, spec.cpus or place.cpu_limit
