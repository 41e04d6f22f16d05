"""GPU slices for JupyterHub spawners: the shared mixin and the local ledger lifecycle.

``GpuShareMixin`` reads and checks the spawn options (form or REST ``user_options``):
the slice, the image, the models, the group rules. ``LedgerGpuMixin`` adds the local
backend's lifecycle (``LocalGpuSpawner``); ``spawner.kube.KubeGpuSpawner`` adds the
Kubernetes one.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from tornado import web
from traitlets import Dict, HasTraits, Integer, List, Unicode, default

from hub import metrics
from hub.market.files import ModelFilesError, inside
from hub.market.rules import installed, launch_blocker, local_prefix
from hub.market.store import Model, Store
from spawner.backends import Backend, ServerGpuSpec, render
from spawner.form import (
    FormChoice,
    form_gpu_value,
    in_form_words,
    render_spawn_form,
    split_gpu_choice,
    whole_gpus_allowed,
)
from spawner.gpus import detect
from spawner.inventory import Gpu, Inventory, build_local
from spawner.ledger import Held, Ledger, LedgerError, server_key
from spawner.placement import Choice, ClusterState, Demand, Workload, explain, make_policy
from spawner.quotas import GroupQuota, Usage, check, largest_slice
from spawner.shares import GpuRequest, RequestKind, ShareError, format_bytes, parse_quantity, parse_request

HOOK_DIR = Path(__file__).parent / "kernel_hook"


class GpuRefused(web.HTTPError):
    """A spawn refused before anything was allocated; the message is for the user."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(status, log_message=message, reason=_http_reason(status))
        self.jupyterhub_message = message  # shown on the spawn page and in progress events
        self.refusal = reason


def _http_reason(status: int) -> str:
    return {400: "Bad Request", 403: "Forbidden", 409: "Conflict"}.get(status, "Error")


@dataclass(frozen=True)
class Machine:
    """This machine's GPUs, detected once per hub process."""

    gpus: tuple[Gpu, ...]
    source: str  # "NVML" or "simulated (...)"

    @property
    def simulated(self) -> bool:
        return self.source.startswith("simulated")


_MACHINES: dict[str, Machine] = {}


def machine(simulate: str) -> Machine:
    if simulate not in _MACHINES:
        gpus, source = detect(simulate)
        _MACHINES[simulate] = Machine(tuple(gpus), source)
    return _MACHINES[simulate]


def group_quota(raw: dict[str, Any]) -> GroupQuota:
    """A group's rules from settings: sizes as text ("4GiB"), lists of images."""

    def size(key: str) -> int | None:
        return None if raw.get(key) is None else parse_quantity(str(raw[key]))

    images = raw.get("images")
    return GroupQuota(
        name=str(raw["name"]),
        max_slice_bytes=size("max_slice"),
        max_gpus=None if raw.get("max_gpus") is None else int(raw["max_gpus"]),
        budget_bytes=size("budget"),
        servers_per_user=None if raw.get("servers_per_user") is None else int(raw["servers_per_user"]),
        allowed_images=None if images is None else frozenset(str(i) for i in images),
    )


class GpuShareMixin(HasTraits):
    """What every gpuslice spawner shares: options, images, models, quotas, the form.

    Expects JupyterHub's Spawner attributes. The lifecycle (where the slice is held)
    belongs to the backend: ``LedgerGpuMixin`` locally, ``KubeGpuSpawner`` in Kubernetes.
    """

    gpu_simulate = Unicode(
        "2x16GiB:T4,1x80GiB:H100",
        help="GPUs to simulate when NVML finds none: COUNTxSIZE[:MODEL], comma-separated.",
    ).tag(config=True)
    gpu_policy = Unicode("default", help="Placement policy (see spawner.placement.POLICIES).").tag(config=True)
    gpu_groups = List(
        Dict(),
        help="""Group rules, each a dict: name, max_slice ("4GiB"), max_gpus, budget ("40GiB"),
        servers_per_user, images (list of image ids). Members come from JupyterHub groups.""",
    ).tag(config=True)
    gpu_images = Dict(
        help="""Images a server may run from: id -> {"path": python env prefix, "description": text}.
        The id "default" runs from the hub's own environment.""",
    ).tag(config=True)
    gpu_default_image = Unicode("default", help="Image used when a request names none.").tag(config=True)
    gpu_default_memory = Unicode("0", help='gpu_memory when a request names none ("0": CPU only).').tag(config=True)
    gpu_market_url = Unicode(
        "", help="SQLAlchemy URL of the image and model market ('' : images come from gpu_images only)."
    ).tag(config=True)
    gpu_models_root = Unicode("", help="Folder holding the model market's files.").tag(config=True)
    gpu_max_cards = Integer(0, help="Most whole cards one server may take (0: as many as the machine has).").tag(
        config=True
    )

    _gpu_spec: ServerGpuSpec | None = None
    _gpu_holds: list[Held] | None = None
    gpu_option_keys = frozenset({"gpu_memory", "gpus", "image", "models"})
    _gpu_starting = False
    _gpu_models: dict[str, Path] | None = None
    _gpu_stages: list[Stage] | None = None

    @default("gpu_images")
    def _default_images(self) -> dict[str, Any]:
        return {"default": {"path": sys.prefix, "description": "The platform's own Python environment"}}

    # -- helpers over JupyterHub's spawner attributes ---------------------------------

    @property
    def _key(self) -> str:
        return server_key(self.user.name, self.name)  # type: ignore[attr-defined]

    @property
    def _machine(self) -> Machine:
        return machine(self.gpu_simulate)

    def _quota_groups(self) -> list[GroupQuota]:
        mine = {g.name for g in self.user.groups}  # type: ignore[attr-defined]
        return [group_quota(g) for g in self.gpu_groups if g.get("name") in mine]

    # -- reading the request ------------------------------------------------------------

    def gpu_request(self) -> tuple[GpuRequest, str]:
        """The request and image from user_options; GpuRefused(400) on bad input."""
        options = self.user_options or {}  # type: ignore[attr-defined]
        if not isinstance(options, dict):
            raise GpuRefused(400, "Spawn options must be a JSON object.", "invalid")
        unknown = set(options) - self.gpu_option_keys
        if unknown:
            raise GpuRefused(
                400,
                f"Unknown spawn option(s): {', '.join(sorted(map(str, unknown)))}. "
                "Use gpu_memory, gpus, image and models.",
                "invalid",
            )
        gpus = self._machine.gpus
        try:
            request = parse_request(
                options.get("gpu_memory", self.gpu_default_memory),
                options.get("gpus", 0),
                largest_card_bytes=max((g.memory_bytes for g in gpus), default=0),
                most_cards=self.gpu_max_cards or len(gpus),
            )
        except ShareError as exc:
            raise GpuRefused(400, str(exc), "invalid") from None
        if request.kind is not RequestKind.CPU and not gpus:
            raise GpuRefused(400, 'This machine has no GPU; ask for gpu_memory "0" (CPU only).', "invalid")
        return request, self._chosen_image(options.get("image") or self.gpu_default_image)

    def images(self) -> dict[str, SpawnImage]:
        """Every image this machine can run: the settings' and the market's."""
        found = {
            slug: SpawnImage(slug, str(spec.get("description", "")), str(spec.get("path") or sys.prefix))
            for slug, spec in self.gpu_images.items()
        }
        store = self._market()
        if store is not None:
            for image in store.images():
                path = local_prefix(image.local_path, sys.prefix)
                if path is not None:
                    found[image.slug] = SpawnImage(
                        image.slug, image.name, str(path), image.status == "deprecated", frozenset(image.groups)
                    )
        return found

    def _chosen_image(self, slug: Any) -> str:
        images = self.images()
        offered = [i.slug for i in self.launchable_images()]
        image = images.get(slug) if isinstance(slug, str) else None
        if image is None:
            raise GpuRefused(400, f"Unknown image {slug!r}; choose one of: {', '.join(sorted(offered))}.", "invalid")
        if image.deprecated:
            raise GpuRefused(
                400, f"Image {slug!r} is deprecated; choose one of: {', '.join(sorted(offered))}.", "invalid"
            )
        blocker = self._launch_blocker(image)
        if blocker:
            raise GpuRefused(403, f"Image {slug!r} is {blocker}.", "quota")
        if not self.image_available(image):
            raise GpuRefused(
                400,
                f"Image {slug!r} is not installed on this machine (no {image.target}/bin/jupyterhub-singleuser); "
                "choose another or ask an admin to install it.",
                "invalid",
            )
        return image.slug

    def image_available(self, image: SpawnImage) -> bool:
        """Whether this backend can run the image (locally: its environment is installed)."""
        return installed(Path(image.target))

    def _may_launch(self, image: SpawnImage) -> bool:
        return not self._launch_blocker(image)

    def _launch_blocker(self, image: SpawnImage) -> str:
        return launch_blocker(
            deprecated=image.deprecated,
            groups=image.groups,
            user_groups=[g.name for g in self.user.groups],  # type: ignore[attr-defined]
            admin=bool(self.user.admin),  # type: ignore[attr-defined]
        )

    def _market(self) -> Store | None:
        return market_store(self.gpu_market_url) if self.gpu_market_url else None

    def wanted_models(self, backend_ready: bool) -> list[Model]:
        """The approved models to mount, from the request or the user's "Use in notebook" picks.

        ``backend_ready``: whether this backend has somewhere to mount them from.
        """
        options = self.user_options or {}  # type: ignore[attr-defined]
        store = self._market()
        wanted = options.get("models")
        if wanted is None:
            wanted = store.selected_models(self.user.name) if store else []  # type: ignore[attr-defined]
        if not isinstance(wanted, list) or not all(isinstance(m, str) for m in wanted):
            raise GpuRefused(400, 'models must be a list of model ids, for example ["langid-97"].', "invalid")
        if wanted and (store is None or not backend_ready):
            raise GpuRefused(400, "This platform has no model market; leave models out.", "invalid")
        models = []
        for slug in dict.fromkeys(wanted):
            model = store.model(slug) if store else None
            if model is None or model.status != "approved":
                raise GpuRefused(400, f"Model {slug!r} is not an approved model in the market.", "invalid")
            models.append(model)
        return models

    def gpu_model_folders(self) -> dict[str, Path]:
        """Each wanted model's folder under the models root (checked again: no way out of it)."""
        folders: dict[str, Path] = {}
        for model in self.wanted_models(bool(self.gpu_models_root)):
            try:
                folders[model.slug] = inside(Path(self.gpu_models_root), model.path)
            except ModelFilesError as exc:
                raise GpuRefused(400, f"Model {model.slug!r} cannot be mounted: {exc}", "invalid") from None
        return folders

    def check_and_place(
        self, request: GpuRequest, image: str, inventory: Inventory, usage: Usage, held: list[Demand]
    ) -> tuple[str | None, Choice | None]:
        """The group charged and where the request goes (None: CPU only); GpuRefused otherwise.

        ``held`` is what the cluster's servers hold now: the policy weighs fragmentation
        against that workload.
        """
        card = max((g.memory_bytes for g in inventory.gpus()), default=0)
        asked_bytes = request.bytes_on(card) * max(1, request.gpus) if request.kind is not RequestKind.CPU else 0
        decision = check(request, asked_bytes, image, self._quota_groups(), usage)
        if not decision.allowed:
            raise GpuRefused(403, str(decision), "quota")
        if request.kind is RequestKind.CPU:
            return decision.group, None
        demand = Demand.from_request(request)
        state = ClusterState.from_inventory(inventory)
        choice = make_policy(self.gpu_policy, Workload.from_demands([demand, *held])).choose(state, demand)
        if choice is None:
            raise GpuRefused(409, str(explain(demand, inventory, request.describe())), "capacity")
        return decision.group, choice

    # -- the spawn form -----------------------------------------------------------------

    @default("options_form")
    def _default_options_form(self) -> Any:
        # A callable: JupyterHub calls it with the spawner each time the form is shown.
        return lambda spawner: spawner.render_form()

    def render_form(self) -> str:
        """The spawn form: free memory per GPU, quota left, and the choices allowed now."""
        inventory, usage = self.form_state()
        groups = self._quota_groups()
        largest_card = max((g.memory_bytes for g in inventory.gpus()), default=0)
        ceiling = largest_slice(groups, usage, largest_card)
        machine_ = self._machine
        simulated = machine_.source.removeprefix("simulated (").removesuffix(")") if machine_.simulated else None
        most_cards = whole_gpus_allowed(groups, self.gpu_max_cards or len(machine_.gpus))
        return render_spawn_form(
            self, inventory, groups, usage, ceiling, most_cards, simulated, self._previous_choice(largest_card)
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
        def first(name: str, fallback: str) -> str:
            values = formdata.get(name) or [fallback]
            return values[0]

        gpu_memory, gpus = first("gpu_memory", self.gpu_default_memory), first("gpus", "0")
        if "gpu" in formdata:  # the form's one GPU select: "0", a slice ("4GiB") or whole cards ("gpus:2")
            gpu_memory, gpus = split_gpu_choice(first("gpu", "0"))
        return {
            "gpu_memory": gpu_memory,
            "gpus": gpus,
            "image": first("image", self.gpu_default_image),
            "models": list(formdata.get("models") or []),
        }

    def _from_form(self) -> bool:
        """Whether this spawn was the spawn page's form (its refusals then use the form's words)."""
        # JupyterHub sets ``handler`` to the request that starts the spawn; the form POSTs to SpawnHandler.
        handler = getattr(self, "handler", None)
        return type(handler).__name__ == "SpawnHandler" and handler.request.method == "POST"  # type: ignore[union-attr]

    def launchable_images(self) -> list[SpawnImage]:
        return [i for i in self.images().values() if self._may_launch(i) and self.image_available(i)]

    def approved_models(self) -> list[Model]:
        store = self._market()
        return store.models(["approved"]) if store and self.gpu_models_root else []

    def selected_models(self) -> set[str]:
        store = self._market()
        return set(store.selected_models(self.user.name)) if store else set()  # type: ignore[attr-defined]


class LedgerGpuMixin(GpuShareMixin):
    """The local backend's lifecycle: the slice is placed here and held in the SQLite ledger.

    On ``start`` it checks the request and the group quotas, places the slice with the
    core's policy and writes it to the ledger, all before the server process exists; it
    releases the slice however the server ends (JupyterHub calls ``clear_state`` for
    each). Each step is recorded as a server event, so the portal can say why a server
    waits or why it failed.
    """

    gpu_ledger_path = Unicode(
        "gpuslice-ledger.sqlite", help="The SQLite file holding every slice handed out on this machine."
    ).tag(config=True)
    # False on a spawner the hub loaded from its database: its first poll checks the server.
    _gpu_checked_since_restart = False
    _gpu_silent_after_restart = False

    @property
    def _ledger(self) -> Ledger:
        return Ledger(self.gpu_ledger_path)

    def _inventory(self, holds: list[Held]) -> Inventory:
        return build_local(self._machine.gpus, [(h.gpu_index, h.allocation()) for h in holds])

    def form_state(self) -> tuple[Inventory, Usage]:
        others = [h for h in self._ledger.holdings() if h.key != self._key]
        return self._inventory(others), _usage(others, self.user.name)  # type: ignore[attr-defined]

    # -- the decision, inside the ledger's transaction ----------------------------------

    def _decide(self, request: GpuRequest, image: str, holds: list[Held]) -> list[Held]:
        inventory = self._inventory(holds)
        usage = _usage(holds, self.user.name)  # type: ignore[attr-defined]
        group, choice = self.check_and_place(request, image, inventory, usage, [_demand_of(h) for h in holds])
        if choice is None:
            return []
        node = inventory.nodes[choice.node]
        return [
            Held(
                self._key,
                node.gpus[i].index,
                self.user.name,  # type: ignore[attr-defined]
                self.name,  # type: ignore[attr-defined]
                node.gpus[i].memory_bytes
                if request.kind is RequestKind.WHOLE
                else request.bytes_on(node.gpus[i].memory_bytes),
                request.kind is RequestKind.WHOLE,
                group,
            )
            for i in choice.gpus
        ]

    def allocate(self) -> tuple[GpuRequest, list[Held]]:
        """Check and place the request; write it to the ledger. Counts refusals."""
        self._gpu_stages = []
        try:
            request, image = self.gpu_request()
            self._gpu_models = self.gpu_model_folders()
            self._record("requested", 10, f"asked for {request.describe()} with image {image}")
            self._stage(10, f"asked for {request.describe()} with image {image}")
            holds = self._ledger.allocate(self._key, lambda current: self._decide(request, image, current))
        except GpuRefused as refusal:
            metrics.SPAWN_REFUSED.labels(reason=refusal.refusal).inc()
            if self._from_form():
                refusal.jupyterhub_message = in_form_words(refusal.jupyterhub_message)
            self._record("refused", 100, refusal.jupyterhub_message)
            raise
        assert holds is not None  # _decide raises rather than returning None
        return request, holds

    def _spec_for(self, request: GpuRequest, holds: list[Held]) -> ServerGpuSpec:
        if not holds:
            return render(request, Backend.LOCAL)
        by_index = {g.index: g for g in self._machine.gpus}
        cards = [by_index[h.gpu_index] for h in holds]
        devices = tuple(g.uuid if not g.simulated else str(g.index) for g in cards)
        return render(request, Backend.LOCAL, card_bytes=cards[0].memory_bytes, devices=devices)

    # -- the spawner lifecycle ----------------------------------------------------------

    async def start(self) -> Any:
        request, holds = self.allocate()
        self._gpu_holds = holds
        self._gpu_spec = self._spec_for(request, holds)
        placed = self.placement_text() or "no GPU"
        self.log.info("gpuslice: %s gets %s: %s", self._key, request.describe(), placed)  # type: ignore[attr-defined]
        self._record("placed", 20, f"placed: {placed}; starting the server")
        self._stage(20, f"GPU placed: {placed}")
        self._gpu_starting = True
        self._gpu_checked_since_restart = True  # this hub process watches the start itself
        self._gpu_silent_after_restart = False
        try:
            self.prepare_home()
            self._stage(35, "home folder ready")
            self.prepare_server()
            models = ", ".join(self._gpu_models or {})
            self._stage(50, f"models mounted in ~/models: {models}" if models else "no models to mount")
            result = await super().start()  # type: ignore[misc]
        except BaseException as exc:
            self._ledger.release(self._key)
            self._gpu_holds = None
            self._record("failed", 100, f"the server did not start: {exc or type(exc).__name__}")
            raise
        finally:
            self._gpu_starting = False
        pid = getattr(self, "pid", 0)
        if pid and holds:
            self._ledger.set_pid(self._key, pid)
        started = f"server process started{f' (pid {pid})' if pid else ''}; waiting for it to answer"
        self._record("started", 50, started)
        self._stage(70, started)
        return result

    def prepare_home(self) -> None:
        """Called after the slice is held: make the user's home folder (a backend knows where)."""

    def prepare_server(self) -> None:
        """Called after the slice is held, before the server starts (a backend mounts models here)."""

    async def poll(self) -> int | None:
        status: int | None = await super().poll()  # type: ignore[misc]
        if status is None and not self._gpu_checked_since_restart:
            # The hub's first look at a server it did not start (it restarted meanwhile).
            self._gpu_checked_since_restart = True
            status = await self._answer_or_exit()
        if status is None and self._gpu_holds:
            # Running: make sure the ledger still holds the slice (it may have been lost).
            self._ledger.restore(self._gpu_holds)
        if status is not None and not self._gpu_silent_after_restart and self._last_event_kind() == "started":
            # Nobody stopped it (stop() records "stopped"): it crashed, exited or was killed.
            self._record("died", 100, _died_message(status))
        return status

    async def stop(self, now: bool = False) -> None:
        self._record(*self._stop_reason())
        await super().stop(now=now)  # type: ignore[misc]

    async def _answer_or_exit(self) -> int | None:
        """After a hub restart: wait until the server answers HTTP, exits, or ``http_timeout`` passes.

        JupyterHub itself only waits for an answer (up to ``http_timeout``), without
        looking at the process. A server that was starting while the hub was down gives
        up on reaching the hub after about 45 s and exits; without this check it stays
        "pending" and holds its slice for the whole ``http_timeout``.
        """
        timeout = self.http_timeout  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        url = f"{self.server.url}api"  # type: ignore[attr-defined]
        while True:
            if await _answers_http(url):
                return None
            status: int | None = await super().poll()  # type: ignore[misc]
            if status is not None:
                return status
            if time.monotonic() > deadline:
                # Alive but silent: JupyterHub stops it on a non-None status (stop() says why).
                message = "gpuslice: %s did not answer at %s within %s s after the hub restarted"
                self.log.warning(message, self._key, url, timeout)  # type: ignore[attr-defined]
                self._gpu_silent_after_restart = True
                return -1
            await asyncio.sleep(1.0)

    def _stop_reason(self) -> tuple[str, int, str]:
        # JupyterHub stops a server it gave up on from inside start or the wait for it to answer.
        if self._gpu_silent_after_restart:
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s after the hub restarted"
        if self._gpu_starting:
            timeout = self.start_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not start within {timeout} s"
        if getattr(self, "_waiting_for_response", False):
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s"
        return "stopped", 100, "stopped"

    def _record(self, kind: str, progress: int, message: str) -> None:
        try:
            self._ledger.record(self._key, kind, progress, message)
        except LedgerError as exc:
            # History is for people reading the portal; never fail a spawn or stop over it.
            self.log.warning("gpuslice: could not record %s event for %s: %s", kind, self._key, exc)  # type: ignore[attr-defined]

    def _stage(self, progress: int, message: str) -> None:
        if self._gpu_stages is not None:
            self._gpu_stages.append(Stage(progress, message, time.monotonic()))

    def _last_event_kind(self) -> str | None:
        history = self._ledger.history(self._key)
        return history[-1].kind if history else None

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()  # type: ignore[misc]
        if self._gpu_spec is not None:
            env.update(self._gpu_spec.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK_DIR), env.get("PYTHONPATH", "")]))
        if self._machine.simulated and self._gpu_holds:
            env["GPUSLICE_SIMULATED"] = "1"
        if self._gpu_models:
            env["GPUSLICE_MODELS"] = ",".join(self._gpu_models)
        return env

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()  # type: ignore[misc]
        if self._gpu_holds:
            state["gpuslice_holds"] = [h.__dict__ for h in self._gpu_holds]
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        self._gpu_holds = [Held(**h) for h in state.get("gpuslice_holds", [])] or None

    def clear_state(self) -> None:
        # Every way a server ends passes here: stopped, died (JupyterHub skips stop()
        # for a dead server), culled, failed to start, or found dead after a restart.
        super().clear_state()  # type: ignore[misc]
        self._ledger.release(self._key)
        self._gpu_holds = None

    def placement_text(self) -> str:
        if not self._gpu_holds:
            return ""
        by_index = {g.index: g for g in self._machine.gpus}
        parts = []
        for h in self._gpu_holds:
            gpu = by_index[h.gpu_index]
            label = f"GPU {gpu.index} ({gpu.model}{', simulated' if gpu.simulated else ''})"
            parts.append(f"{label}" if h.whole else f"{format_bytes(h.memory_bytes)} of {label}")
        return ", ".join(parts)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Each stage of the start as it happens, with how long it took, then the first answer.

        JupyterHub stops reading when the spawn ends and sends its own "ready" event (100%).
        The isolation warning comes once: here, unless the form already showed it.
        """
        sent, since = 0, None
        warned = self._from_form()
        while True:
            stages = self._gpu_stages or []  # start() makes a new list; read it each round
            since = since if since is not None else (stages[0].at if stages else None)
            for stage in stages[sent:]:
                took = stage.at - (since if since is not None else stage.at)
                yield {"progress": stage.progress, "message": f"{stage.message} ({took:.1f} s)"}
                since, sent = stage.at, sent + 1
                if stage.progress == 20 and not warned and self._gpu_spec is not None:
                    for warning in self._gpu_spec.warnings:
                        yield {"progress": 20, "message": warning}
                    warned = True
            started = stages and stages[-1].progress >= 70 and self.server is not None  # type: ignore[attr-defined]
            if started and await _answers_http(f"{self.server.url}api"):  # type: ignore[attr-defined]
                took = time.monotonic() - (since or time.monotonic())
                yield {"progress": 90, "message": f"server answering ({took:.1f} s)"}
                return
            await asyncio.sleep(0.25)


@dataclass(frozen=True)
class Stage:
    """One step of a start, for the progress bar: percent, what happened, when (monotonic)."""

    progress: int
    message: str
    at: float


@dataclass(frozen=True)
class SpawnImage:
    """An image a server can run: a Python environment prefix (local) or a container (Kubernetes)."""

    slug: str
    description: str
    target: str
    deprecated: bool = False
    groups: frozenset[str] = frozenset()


_STORES: dict[str, Store] = {}


def market_store(url: str) -> Store:
    """One Store (engine and pool) per URL per process."""
    if url not in _STORES:
        _STORES[url] = Store(url)
    return _STORES[url]


async def _answers_http(url: str) -> bool:
    """Whether a server answers at ``url`` as JupyterHub counts it: any status below 500.

    Not ``jupyterhub.utils.wait_for_http_server``: its attempts have no short timeout (a
    stopped server would hold one for minutes), and the caller watches the process between tries.
    """
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            return response.status < 500
    except (TimeoutError, aiohttp.ClientError):
        return False


def _died_message(status: int) -> str:
    if status < 0:
        return f"the server was killed by signal {-status} (not stopped through the hub)"
    if status:
        return f"the server exited with status {status} (not stopped through the hub)"
    return "the server process ended without being stopped through the hub (killed, crashed or out of memory)"


def _usage(holds: list[Held], user: str) -> Usage:
    """What ``holds`` (everyone's but the server being started) count against the rules."""
    return Usage(user_servers=len({h.key for h in holds if h.user == user}), group_bytes=_group_bytes(holds))


def _group_bytes(holds: list[Held]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for h in holds:
        if h.group:
            totals[h.group] = totals.get(h.group, 0) + h.memory_bytes
    return totals


def _demand_of(hold: Held) -> Demand:
    return Demand(gpus=1) if hold.whole else Demand(slice_units=float(hold.memory_bytes))
