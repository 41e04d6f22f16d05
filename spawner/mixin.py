"""What every gpuslice spawner shares: the request, the group rules, placement and the form.

``GpuShareMixin`` reads and checks the spawn options (form or REST ``user_options``):
the slice (spawner/request.py), the image and models (spawner/images.py), the group
rules, and where the slice goes. ``spawner.lifecycle.LedgerGpuMixin`` adds the local
backend's lifecycle (``LocalGpuSpawner``); ``spawner.kube.KubeGpuSpawner`` adds the
Kubernetes one.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Integer, List, TraitError, Unicode, default, validate

from spawner.class_store import ClassStore
from spawner.form import FormChoice, form_gpu_value, render_spawn_form, whole_gpus_allowed
from spawner.gpus import DEFAULT_SIMULATE, Machine, machine
from spawner.images import ImagesMixin
from spawner.inventory import Inventory
from spawner.ledger import Held, server_key
from spawner.placement import Choice, ClusterState, Demand, arrived_counts, explain, known_workload, make_policy
from spawner.quotas import (
    DEFAULT_GROUP,
    GroupQuota,
    GroupRules,
    GroupRulesError,
    Usage,
    check,
    largest_slice,
    read_groups,
    rules_for,
)
from spawner.request import OPTION_KEYS, GpuRefused, options_from_form, read_request
from spawner.shares import (
    DEFAULT_SMALLEST_SLICE,
    GpuRequest,
    RequestKind,
    ShareError,
    parse_quantity,
    parse_request,
    quantity_text,
)
from spawner.sharing.base import ServerGpuSpec


def asked_bytes(request: GpuRequest, inventory: Inventory) -> int:
    """GPU memory ``request`` takes in all (charged against group budgets); 0 for CPU only."""
    if request.kind is RequestKind.CPU:
        return 0
    card = max((g.memory_bytes for g in inventory.gpus()), default=0)
    return request.bytes_on(card) * max(1, request.gpus)


class GpuShareMixin(ImagesMixin):
    """What every gpuslice spawner shares: options, images, models, quotas, the form.

    Expects JupyterHub's Spawner attributes. The lifecycle (where the slice is held)
    belongs to the backend: ``LedgerGpuMixin`` locally, ``KubeGpuSpawner`` in Kubernetes.
    """

    gpu_simulate = Unicode(
        DEFAULT_SIMULATE,
        help="GPUs to simulate when NVML finds none: COUNTxSIZE[:MODEL], comma-separated.",
    ).tag(config=True)
    gpu_policy = Unicode("default", help="Placement policy (see spawner.placement.POLICIES).").tag(config=True)
    gpu_groups = List(
        AnyTrait(),
        help="""Group rules, each a dict: name, max_slice ("4GiB"), max_gpus, budget ("40GiB"),
        servers_per_user, images (list of image ids); read once into GroupRules (spawner/quotas.py).
        Members come from JupyterHub groups; users in none get the group named "default" (or the
        built-in default rules: a small slice, no whole cards, one server).""",
    ).tag(config=True)
    gpu_classes_path = Unicode(
        "",
        help="""The class store (spawner/class_store.py) the hub and `gpuslice class` share: the classes' rules
        are read from it at every spawn, so classes change without a restart. Empty: gpu_groups as configured.""",
    ).tag(config=True)
    gpu_default_memory = Unicode("0", help='gpu_memory when a request names none ("0": CPU only).').tag(config=True)
    gpu_smallest_slice = Unicode(
        quantity_text(DEFAULT_SMALLEST_SLICE),
        help="The smallest slice a server may ask for; smaller ones are refused with this size as the fix.",
    ).tag(config=True)
    gpu_culler_timeout = Integer(
        0, help="The idle culler's timeout in seconds (0: no culler), to say who stopped an idle server."
    ).tag(config=True)
    gpu_max_cards = Integer(0, help="Most whole cards one server may take (0: as many as the machine has).").tag(
        config=True
    )

    _gpu_spec: ServerGpuSpec | None = None
    _gpu_holds: list[Held] | None = None
    gpu_option_keys = OPTION_KEYS
    _gpu_starting = False
    _gpu_models: dict[str, Path] | None = None

    # -- helpers over JupyterHub's spawner attributes ---------------------------------

    def _last_activity_ts(self) -> float | None:
        """The server's last activity as the hub's database has it (seconds since the epoch), if any."""
        activity = getattr(getattr(self, "orm_spawner", None), "last_activity", None)  # naive UTC
        return activity.replace(tzinfo=UTC).timestamp() if activity is not None else None

    @property
    def _key(self) -> str:
        return server_key(self.user.name, self.name)  # type: ignore[attr-defined]

    @property
    def _machine(self) -> Machine:
        return machine(self.gpu_simulate)

    @validate("gpu_groups")
    def _typed_groups(self, proposal: dict[str, Any]) -> list[GroupRules]:
        """Each group's rules read once, here (the config may give dicts, as z2jh's values do)."""
        try:
            return list(read_groups(proposal["value"]))
        except GroupRulesError as exc:
            raise TraitError(f"{type(self).__name__}.gpu_groups: {exc}") from None

    @property
    def gpu_group_rules(self) -> list[GroupRules]:
        """The groups' rules now: the class store's classes when there is one (they change live) with the
        configured ``default`` rules; else ``gpu_groups`` as the GroupRules they were read into."""
        configured = [rules for rules in self.gpu_groups if isinstance(rules, GroupRules)]
        if not self.gpu_classes_path:
            return configured
        return [*ClassStore(self.gpu_classes_path).groups(), *(g for g in configured if g.name == DEFAULT_GROUP)]

    def _quota_groups(self) -> list[GroupQuota]:
        """The rules that hold for this user: their classes' (their hub groups' or those whose ``members``
        name them: a member added live) in configured order, else the default rules."""
        name = self.user.name  # type: ignore[attr-defined]
        rules = self.gpu_group_rules
        mine = [g.name for g in self.user.groups] + [g.name for g in rules if name in g.members]  # type: ignore[attr-defined]
        return [group.quota for group in rules_for(mine, rules)]

    # -- reading the request ------------------------------------------------------------

    def gpu_request(self) -> tuple[GpuRequest, str]:
        """The request and image from user_options; GpuRefused(400) on bad input."""
        options = self.user_options or {}  # type: ignore[attr-defined]
        machine_ = self._machine
        request = read_request(
            options,
            self.gpu_default_memory,
            machine_.gpus,
            self.gpu_max_cards,
            self.gpu_option_keys,
            parse_quantity(self.gpu_smallest_slice),
        )
        return request, self._chosen_image(options.get("image") or self.gpu_default_image)

    def check_and_place(
        self, request: GpuRequest, image: str, inventory: Inventory, usage: Usage, held: list[Demand]
    ) -> tuple[str | None, Choice | None]:
        """The group charged and where the request goes (None: CPU only); GpuRefused otherwise.

        ``held`` is what the cluster's servers hold now: the policy weighs fragmentation
        against that workload.
        """
        decision = check(request, asked_bytes(request, inventory), image, self._quota_groups(), usage)
        if not decision.allowed:
            refused = GpuRefused(403, str(decision), "quota")
            refused.waitable = decision.rule == "budget"
            raise refused
        if request.kind is RequestKind.CPU:
            return decision.group, None
        demand = Demand.from_request(request)
        state = ClusterState.from_inventory(inventory)
        workload = known_workload(arrived_counts(held), demand)
        choice = make_policy(self.gpu_policy, workload, once=True).choose(state, demand)
        if choice is None:
            refused = GpuRefused(409, str(explain(demand, inventory, request.describe())), "capacity")
            refused.waitable = True
            raise refused
        return decision.group, choice

    # -- the spawn form -----------------------------------------------------------------

    @default("options_form")
    def _default_options_form(self) -> Any:
        # A callable: JupyterHub calls it with the spawner each time the form is shown.
        return lambda spawner: spawner.render_form()

    def render_form(self) -> str:
        """The spawn form: free memory per GPU, the class's rules, and every choice they can grant."""
        inventory, usage = self.form_state()
        groups = self._quota_groups()
        largest_card = max((g.memory_bytes for g in inventory.gpus()), default=0)
        largest_free = max((g.free_bytes for g in inventory.gpus() if g.healthy), default=0)
        machine_ = self._machine
        return render_spawn_form(
            self,
            inventory,
            groups,
            usage,
            allowed=largest_slice(groups, Usage(), largest_card),  # what the rules grant, whoever holds what
            startable_now=min(largest_free, largest_slice(groups, usage, largest_card)),
            most_cards=whole_gpus_allowed(groups, self.gpu_max_cards or len(machine_.gpus), largest_card),
            simulated=machine_.simulated,
            previous=self._previous_choice(largest_card),
        )

    def _previous_choice(self, largest_card: int) -> FormChoice | None:
        """What the user chose last (the form shown again after a refusal keeps it); None if nothing valid."""
        options = self.user_options  # type: ignore[attr-defined]
        if not isinstance(options, dict) or not options:
            return None
        try:
            request = parse_request(
                options.get("gpu_memory", "0"), options.get("gpus", 0), largest_card_bytes=largest_card, most_cards=64
            )
        except ShareError:
            return None
        models = options.get("models")
        return FormChoice(
            gpu=form_gpu_value(request, largest_card),
            image=options.get("image") if isinstance(options.get("image"), str) else None,
            models=frozenset(models) if isinstance(models, list) and all(isinstance(m, str) for m in models) else None,
        )

    def form_state(self) -> tuple[Inventory, Usage]:
        """Every GPU with what others hold, and what this user's groups have used."""
        raise NotImplementedError

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        return options_from_form(formdata, self.gpu_default_memory, self.gpu_default_image)

    def _from_form(self) -> bool:
        """Whether this spawn was the spawn page's form (its refusals then use the form's words)."""
        # JupyterHub sets ``handler`` to the request that starts the spawn; the form POSTs to SpawnHandler.
        handler = getattr(self, "handler", None)
        return type(handler).__name__ == "SpawnHandler" and handler.request.method == "POST"  # type: ignore[union-attr]
