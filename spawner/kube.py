"""KubeGpuSpawner: GPU slices over KubeSpawner.

Before a pod is created, the cluster's nodes and pods (one cached listing shared by
every spawn in the hub, refreshed at most every ``gpu_inventory_ttl`` seconds, and begun
after the spawn began) are
turned into the core's inventory; the request is checked against the group rules and
placed by the same policy as the local backend, and a request no node can hold is
refused at once with the core's explanation, or waits in the GPU line (``wait``: the
line of spawner/line.py, kept in the ledger's SQLite file on the hub's volume) with no pod
until the line places it. A placement whose pod the listing does not count yet (not
listed, or not yet bound to its node) is written to the ledger's ``placing`` in the
transaction that decides it, and every placement counts those rows (the hub's spawns and the
job dispatcher, hub/job_dispatch_kube.py, alike), so no two take the same room. The pod then carries the sharing
backend's resources, annotations and environment; the Kubernetes scheduler (with the
gpushare or HAMi extender) makes the final placement. A pod that still goes Pending has
its FailedScheduling events translated into the same kind of explanation in the spawn
progress. Allocations live in the pods' annotations, so the idle culler, the portal and
a restarted hub read them from the API; the ledger file keeps only the line (and its events).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.client.models import (
    CoreV1ResourceClaim,
    V1EnvVar,
    V1Pod,
    V1PodResourceClaim,
    V1ResourceRequirements,
    V1Volume,
    V1VolumeMount,
)
from kubespawner import KubeSpawner
from kubespawner.utils import get_k8s_model
from tornado import web
from traitlets import Dict, Float, Instance, Unicode, default, validate

from market.catalog import check_relative
from spawner import environ, sharing
from spawner.gpus import Machine
from spawner.images import SpawnImage
from spawner.inventory import (
    GROUP_ANNOTATION,
    SERVERNAME,
    USERNAME,
    Allocation,
    Gpu,
    Inventory,
    Pending,
    holds_resources,
    pod_key,
    with_pending,
)
from spawner.job_request import JobPlace
from spawner.jobs import is_job_key
from spawner.ledger import Held, LedgerError, Placing, server_key, stop_message
from spawner.lifecycle import RestartCheck
from spawner.line import LogRead, WaitingLineMixin
from spawner.mixin import asked_bytes
from spawner.placement import Choice, ClusterState, Demand, explain, held_demands, make_policy
from spawner.quotas import Usage
from spawner.request import OPTION_KEYS, GpuRefused
from spawner.shares import GpuRequest, RequestKind, format_bytes, parse_quantity
from spawner.sharing.base import ApiList, Listing, SharingBackend, Target
from spawner.sharing.gpushare import unit_bytes
from spawner.stop_events import STOPPED, pod_event, stop_request
from spawner.waitline import Entry, Reservation, activity_report_interval

TRANSIENT_STATUSES = {429, 500, 502, 503, 504}
STOP_NOTE_TIMEOUT_S = 5  # the note of who stopped a server waits no longer than this for the API


class ApiUnavailableError(web.HTTPError):
    """The Kubernetes API kept failing; the message is for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(503, log_message=message, reason="Service Unavailable")
        self.jupyterhub_message = message


MODELS_VOLUME = "gpuslice-models"
CLAIM = "gpu"  # the pod's resource claim (DRA), made from the template named after the pod
MODELS_DIR = "/models"
JOB_HOME = "/home/jovyan"  # a job pod's working folder (the notebook image's user)


@dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    taken: float
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # the backend's other lists


class ClusterCache:
    """One listing of nodes and pods shared by all spawns: never an API call per spawn per node."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()

    async def get(
        self, api: Any, namespace: str, ttl_s: float, reads: tuple[ApiList, ...] = (), since: float = -math.inf
    ) -> Snapshot:
        """Nodes, the namespace's pods, and the lists the sharing backend reads (``reads``): a listing begun at
        ``since`` (time.monotonic) or later, and at most ``ttl_s`` old."""
        async with self._lock:  # fifty spawns at 9:00 make one listing, not fifty
            now = time.monotonic()
            if self._snapshot is None or now - self._snapshot.taken > ttl_s or self._snapshot.taken < since:
                nodes = await _items(api.list_node(_preload_content=False))
                pods = await _items(api.list_namespaced_pod(namespace, _preload_content=False))
                objects = {read.key: await _items(_get(api, read.path)) for read in reads}
                self._snapshot = Snapshot(nodes, pods, now, objects)  # taken when it began: it holds what was there
            return self._snapshot

    def forget(self) -> None:
        self._snapshot = None


def _get(api: Any, path: str) -> Any:
    """GET any path of the API (another group's list) with the hub's credentials, unread."""
    headers = {"Accept": "application/json"}
    return api.api_client.call_api(
        path, "GET", header_params=headers, auth_settings=["BearerToken"], _preload_content=False
    )


async def _send(api: Any, method: str, path: str, body: Any = None) -> int:
    """POST, PUT or DELETE any path of the API; the HTTP status (ApiException for errors other than 404/409)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    response = await api.api_client.call_api(
        path, method, header_params=headers, body=body, auth_settings=["BearerToken"], _preload_content=False
    )
    raw = await response.read()
    if response.status >= 400 and response.status not in (404, 409):
        error = ApiException(status=response.status, reason=response.reason)
        error.body = raw
        raise error
    return int(response.status)


async def _items(call: Any) -> list[dict[str, Any]]:
    response = await call
    raw = await response.read()
    if not 200 <= response.status <= 299:  # unread (_preload_content=False), the client raises for nothing
        error = ApiException(status=response.status, reason=response.reason)
        error.body = raw  # the API's Status, with its message
        raise error
    return list(json.loads(raw).get("items") or [])


CACHES: dict[str, ClusterCache] = {}


def usage_from_pods(pods: list[dict[str, Any]], user: str, except_pod: str, pending: Iterable[Pending] = ()) -> Usage:
    """What the pods' annotations count against the group rules (the pod being started excluded),
    with the ``pending`` placements whose pods are not listed yet (by name, or by user and server: a job's)."""
    servers = 0
    group_bytes: dict[str, int] = {}
    listed = {pod.get("metadata", {}).get("name") for pod in pods}
    listed |= {pod_key(pod) for pod in pods if holds_resources(pod)}  # a job's pod: named by the Job controller
    for placed in pending:
        if placed.pod in listed or placed.key in listed or placed.pod == except_pod:
            continue
        servers += placed.allocation.user == user and not is_job_key(placed.key)
        if placed.group:
            group_bytes[placed.group] = group_bytes.get(placed.group, 0) + placed.asked_bytes
    for pod in pods:
        meta = pod.get("metadata", {})
        if meta.get("name") == except_pod or not holds_resources(pod):
            continue
        annotations = meta.get("annotations") or {}
        is_job = is_job_key(f"/{annotations.get(SERVERNAME, '')}")  # a batch job's pod is not a server
        if not is_job and (annotations.get(USERNAME) or (meta.get("labels") or {}).get(USERNAME)) == user:
            servers += 1
        group = annotations.get(GROUP_ANNOTATION)
        if group:
            group_bytes[group] = group_bytes.get(group, 0) + int(annotations.get("gpuslice.io/gpu-memory-bytes", 0))
    return Usage(user_servers=servers, group_bytes=group_bytes)


@dataclass(frozen=True)
class PodAdditions:
    """What one spawn adds to the pod KubeSpawner builds from its traits (which stay as configured)."""

    limits: dict[str, str]
    annotations: dict[str, str]
    env: dict[str, str]
    image: str
    scheduler_name: str  # "" : KubeSpawner's scheduler_name
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    claim_template: str = ""  # a ResourceClaimTemplate the pod's container claims its GPU from (DRA)


def add_to_pod(pod: V1Pod, extra: PodAdditions) -> V1Pod:
    """The pod KubeSpawner made, with a spawn's GPU resources, annotations, env, image and volumes."""
    container = pod.spec.containers[0]
    container.image = extra.image
    resources = container.resources or V1ResourceRequirements()
    resources.limits = {**(resources.limits or {}), **extra.limits}
    container.resources = resources
    pod.metadata.annotations = {**(pod.metadata.annotations or {}), **extra.annotations}
    pod.metadata.labels = {**(pod.metadata.labels or {}), **extra.labels}
    if extra.claim_template:
        claim = V1PodResourceClaim(name=CLAIM, resource_claim_template_name=extra.claim_template)
        pod.spec.resource_claims = [*(pod.spec.resource_claims or []), claim]
        resources.claims = [*(resources.claims or []), CoreV1ResourceClaim(name=CLAIM)]
    kept = [e for e in container.env or [] if e.name not in extra.env]
    container.env = [*kept, *(V1EnvVar(name=name, value=value) for name, value in extra.env.items())]
    if extra.scheduler_name:
        pod.spec.scheduler_name = extra.scheduler_name
    pod.spec.volumes = [*(pod.spec.volumes or []), *(get_k8s_model(V1Volume, v) for v in extra.volumes)]
    mounts = (get_k8s_model(V1VolumeMount, m) for m in extra.volume_mounts)
    container.volume_mounts = [*(container.volume_mounts or []), *mounts]
    return pod


def chosen_card(inventory: Inventory, choice: Choice | None) -> Gpu | None:
    """The (first) card a placement chose (None for a CPU-only server)."""
    if choice is None or not choice.gpus:
        return None
    return inventory.nodes[choice.node].gpus[choice.gpus[0]]


def room_for(demand: Demand, inventory: Inventory) -> Gpu | None:
    """A card where ``demand`` fits now (the first of a placement's cards), or None."""
    return chosen_card(inventory, make_policy("best-fit").choose(ClusterState.from_inventory(inventory), demand))


def without_pod(inventory: Inventory, pod: str) -> Inventory:
    """``inventory`` as if ``pod`` held nothing: a waiting pod's own placement is not room taken from it."""
    nodes = [
        replace(node, gpus=[replace(g, allocations=[a for a in g.allocations if a.owner != pod]) for g in node.gpus])
        for node in inventory.nodes
    ]
    return replace(inventory, nodes=nodes)


def scheduling_message(event_message: str, explanation: str) -> str:
    """A FailedScheduling event as a person reads it: why, and what would start now."""
    return f"Waiting for a GPU: {explanation} (scheduler: {event_message})"


def unallocated_claim(request: GpuRequest, inventory: Inventory, pinned: Gpu | None, room: Gpu) -> str:
    """Why kube-scheduler cannot allocate a DRA claim where the hub sees ``room``: the hub lists every claim in
    the cluster, so no workload is hidden from it; a slice's claim asks for the card chosen at placement
    (``pinned``, by its UUID), whole cards for any."""
    asked = request.describe()
    uuid = pinned.uuid if pinned is not None and request.kind is not RequestKind.WHOLE else ""
    card = next((g for g in inventory.gpus() if uuid and g.uuid == uuid), None)
    needed = request.bytes_on(card.memory_bytes) if card is not None else 0
    if card is not None and card.free_bytes < needed:
        moved = "" if room is card else f"; {room.node} GPU {room.index} has room now: start again to be placed there"
        return (
            f"its claim asks for {card.node} GPU {card.index} ({card.model}), the card chosen when it was placed, "
            f"where {format_bytes(card.free_bytes)} is free now; the server starts when {format_bytes(needed)} is "
            f"free there{moved}."
        )
    why = "; ".join(inventory.warnings) or "a claim made since the hub last listed them may hold it"
    return f"kube-scheduler cannot allocate its claim though the hub sees room for {asked}: {why}."


class RetryingPodCreate:
    """The hub's CoreV1Api client, with a pod create that the API answers 429 or 5xx retried.

    KubeSpawner retries a create that times out (and one that meets a 409) until
    ``k8s_api_request_retry_timeout`` and gives up at once on any other error; a server-side
    error is as passing as a timeout, so it is told as one (``note`` hears what the API said).
    Every other call goes to the client unchanged.
    """

    def __init__(self, api: Any, note: Callable[[str], None]) -> None:
        self._api = api
        self._note = note

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        try:
            return await self._api.create_namespaced_pod(namespace, body, **kwargs)
        except ApiException as exc:
            if exc.status not in TRANSIENT_STATUSES:
                raise
            self._note(f"HTTP {exc.status} {exc.reason}")
            raise TimeoutError(f"HTTP {exc.status} {exc.reason}") from exc  # KubeSpawner tries again


class KubeGpuSpawner(WaitingLineMixin, KubeSpawner):  # type: ignore[misc]
    gpu_backend = Unicode(
        "gpushare",
        help="How the cluster shares GPUs: a backend of spawner/sharing/ (gpushare, hami, timeslicing, ...).",
    ).tag(config=True)
    gpu_backend_settings = Dict(
        help="""The sharing backend's own settings, by the names of its fields in spawner/sharing/<backend>.py
        (for example {"cores_percent": 30} for hami)."""
    ).tag(config=True)
    gpushare_memory_unit = Unicode(
        "",
        help="""gpushare's device plugin --memory-unit (GiB or MiB): the unit of aliyun.com/gpu-mem
        in node capacity, pod limits and ALIYUN_COM_GPU_MEM_POD. Empty: inferred from the nodes as
        gpushare's inspect tool does (more than 100 units per card is MiB); a unit set wins, with a
        warning in the log when the nodes read otherwise.""",
    ).tag(config=True)
    gpu_inventory_ttl = Float(5.0, help="Seconds a listing of nodes and pods is reused across spawns.").tag(config=True)
    gpu_profile_groups = Dict(
        help="Profile slug -> groups allowed to choose it (a profile not listed is open to everyone)."
    ).tag(config=True)
    gpu_scheduler_name = Unicode(
        "",
        help="""The scheduler for pods that hold a GPU: the one whose configuration consults the sharing
        backend's extender (gpushare's on default-scheduler, hami-scheduler, gpuslice's extender). Empty:
        KubeSpawner's scheduler_name for every pod. Zero to JupyterHub sets scheduler_name to its user
        scheduler, which has no GPU extender; CPU-only pods keep it.""",
    ).tag(config=True)
    gpu_models_volume = Dict(
        help="""Volume source holding the model market's files, for example
        {"persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": true}}.""",
    ).tag(config=True)

    gpu_option_keys = OPTION_KEYS | {"profile", "wait"}
    _gpu_cluster: Inventory | None = None  # the listing's, with the placements it does not count yet
    _gpu_listed: Inventory | None = None  # the listing's alone
    _gpu_pods: list[dict[str, Any]] | None = None  # the listing _gpu_cluster was built from
    _gpu_seen: tuple[Pending, ...] = ()  # the placements _gpu_cluster counts beyond the listing
    _gpu_turn: Placing | None = None  # this spawn's turn in the ledger (its placement is written with it)
    _gpu_sharing: SharingBackend | None = None  # the sharing backend fitted to that listing
    _gpu_placement: tuple[str | None, Choice | None] | None = None  # the group charged and where, once placed
    _gpu_api_error = ""
    _gpu_pod: PodAdditions | None = None  # this spawn's, added in get_pod_manifest
    _gpu_claim: dict[str, Any] | None = None  # this spawn's ResourceClaimTemplate spec (DRA)
    _gpu_card: Gpu | None = None  # the (first) card this spawn's placement chose, as listed then
    _gpu_placing = False  # start() checks and places; KubeSpawner's start has not begun
    _gpu_held: tuple[float, str | None] | None = None  # since when its pod holds a GPU, and the group charged
    _gpu_restart = Instance(RestartCheck, args=(), help="The first poll after a hub restart (one per spawner).")

    @validate("gpu_backend")
    def _check_backend(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        allowed = sharing.names(kubernetes=True)
        if value not in allowed:
            raise ValueError(f"gpu_backend must be one of {', '.join(allowed)}, not {value!r}")
        return value

    @validate("gpushare_memory_unit")
    def _check_gpushare_unit(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        unit_bytes(value)  # raises with the allowed units
        return value

    @default("options_form")
    def _default_options_form(self) -> Any:
        return _render_form_async

    # -- the cluster ---------------------------------------------------------------------

    def sharing_backend(self) -> SharingBackend:
        """The sharing backend with its settings (gpushare's memory unit from its own trait)."""
        settings = {"memory_unit": self.gpushare_memory_unit} if self.gpu_backend == "gpushare" else {}
        return sharing.backend(self.gpu_backend, **{**settings, **self.gpu_backend_settings})

    async def cluster(self, since: float = -math.inf) -> tuple[Inventory, list[dict[str, Any]]]:
        """The cluster's GPUs and the namespace's pods, from a listing begun at ``since`` or later (ClusterCache)."""
        cache = CACHES.setdefault(self.namespace, ClusterCache())
        try:
            reads = self.sharing_backend().reads
            snapshot = await cache.get(self.api, self.namespace, self.gpu_inventory_ttl, reads, since)
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise
            raise ApiUnavailableError(
                f"The hub may not read the cluster's nodes and pods (HTTP {exc.status} {exc.reason}); nothing was "
                "started. Its ServiceAccount needs get, list and watch on nodes: helm/gpuslice grants them (with "
                "Zero to JupyterHub, install it beside in companion mode, docs/kubernetes.md). Tell an admin."
            ) from exc
        listing = Listing(snapshot.nodes, snapshot.pods, snapshot.objects, now=datetime.now(UTC))
        self._gpu_sharing, inventory = sharing.read(self.sharing_backend(), listing)
        for warning in inventory.warnings:
            self.log.warning("gpuslice inventory: %s", warning)
        self._gpu_listed, self._gpu_pods = inventory, snapshot.pods
        self._gpu_cluster = self._counting(self._ledger.placing())
        return self._gpu_cluster, snapshot.pods

    def _counting(self, placing: list[Pending]) -> Inventory:
        """The cluster as listed, with the placements (the ledger's ``placing``) it does not count yet but this
        spawn's own (``self._gpu_seen``: those counted)."""
        assert self._gpu_listed is not None and self._gpu_pods is not None  # cluster() came first
        inventory, live = with_pending(self._gpu_listed, self._gpu_pods, placing, time.time(), but=self._key)
        self._gpu_seen = tuple(live)
        return inventory

    @property
    def _machine(self) -> Machine:
        gpus = tuple(self._gpu_cluster.gpus()) if self._gpu_cluster else ()
        return Machine(gpus, f"Kubernetes ({self.gpu_backend})")

    def form_state(self) -> tuple[Inventory, Usage]:
        inventory = self._gpu_cluster or Inventory([], self.gpu_backend)
        return inventory, Usage()

    # -- images and models ---------------------------------------------------------------

    def images(self) -> dict[str, SpawnImage]:
        found = {
            slug: SpawnImage(slug, str(spec.get("description", "")), str(spec.get("container") or self.image))
            for slug, spec in self.gpu_images.items()
        }
        store = self._market()
        for image in store.images() if store else []:
            if image.container:
                found[image.slug] = SpawnImage(
                    image.slug, image.name, image.container, image.status == "deprecated", frozenset(image.groups)
                )
        return found

    def image_available(self, image: SpawnImage) -> bool:
        return bool(image.target)

    def _model_mounts(self) -> list[dict[str, Any]]:
        """Read-only subPath mounts of the models volume at /models/<id>."""
        mounts = []
        for model in self.wanted_models(bool(self.gpu_models_volume)):
            check_relative(model.path)
            mount = {"name": MODELS_VOLUME, "mountPath": f"{MODELS_DIR}/{model.slug}", "subPath": model.path}
            mounts.append({**mount, "readOnly": True})
        return mounts

    # -- batch jobs (hub/jobs_api.py; hub/job_dispatch_kube.py makes their Jobs) --------------

    def job_place(self, image: str, group: str | None) -> JobPlace:
        """A job's pod runs the image's container as the notebook pods' user, in their home's place, with the
        notebook pods' memory and CPU limits unless it asks for less; its notebook is read there when it runs
        (the hub cannot look into a volume now)."""
        memory = parse_quantity(str(self.mem_limit)) if self.mem_limit else None
        cpus = float(self.cpu_limit) if self.cpu_limit else None
        target = self.images()[image].target
        return JobPlace(target, Path(JOB_HOME), "", memory, sees_home=False, cpu_limit=cpus, limits_in_plan=True)

    async def gpu_job_log(self, job: Any, read: LogRead) -> tuple[bytes, int]:
        """The output of the job's newest pod, from the pod log API."""
        selector = f"gpuslice.io/job={job.id}"
        pods = await _items(
            self.api.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        )
        if not pods:
            return b"", 0
        newest = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        try:
            text = await self.api.read_namespaced_pod_log(newest["metadata"]["name"], self.namespace)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return b"", 0
            raise
        data = str(text).encode()
        start, length = read.window(len(data))
        return data[start : None if length is None else start + length], len(data)

    # -- the lifecycle -------------------------------------------------------------------

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.api: Any = RetryingPodCreate(self.api, self._note_api_error)

    async def _start_reflector(self, kind: str, reflector_class: Any, replace: bool = False, **kwargs: Any) -> Any:
        """KubeSpawner's shared reflector start, made safe for the spawns that share it.

        The one private KubeSpawner method overridden (tests/kube/test_kube_public_hooks.py allows
        only it): KubeSpawner starts its class-wide reflectors inside its own ``_start``, ``poll``,
        ``stop`` and ``progress`` with no public hook around that start, and the fault is in that
        shared state, so no public override can mend it. KubeSpawner registers a reflector on the
        class before its first list. When one spawn's start fails (the events list answers 500,
        say) it cancels its other reflector start in the middle of that list: the registered
        reflector's first load then never comes, and every later start and stop in the hub waits
        on it (a stop hung past its timeout in CI). A reflector whose first list failed also stays
        registered and is never retried. So the start runs shielded from one spawn's
        cancellation, and a reflector that failed to load is dropped, so the next spawn or stop
        starts a fresh one.
        """
        key = self._get_reflector_key(kind)
        start = asyncio.ensure_future(super()._start_reflector(kind, reflector_class, replace=replace, **kwargs))
        start.add_done_callback(lambda done: _forget_failed_reflector(KubeSpawner.reflectors, key, done))
        return await asyncio.shield(start)

    async def poll(self) -> int | None:
        status: int | None = await super().poll()
        if self._gpu_restart.due(status):  # the hub's first look at a pod it did not start: as the local backend
            url = f"{self.server.url}api"
            status = await self._gpu_restart.check(url, super().poll, self.http_timeout, self.log, self.pod_name)
        return status

    async def start(self) -> Any:
        """Check and place the request (or wait in line), then KubeSpawner's public ``start``
        (its pod from ``get_pod_manifest``). A start that fails lets go of its placement."""
        try:
            return await self._place_and_start()
        except BaseException:
            self._forget_placement()
            raise

    async def _place_and_start(self) -> Any:
        self._gpu_restart.started()  # this hub process watches the start itself
        self._gpu_placing = True
        try:
            await self._check_and_place()
        finally:
            self._gpu_placing = False  # no await until KubeSpawner's start has begun: progress follows it
        self._gpu_api_error = ""
        try:
            await self._write_claim_template()
            return await super().start()
        except ApiException as exc:
            raise ApiUnavailableError(
                f"The Kubernetes API answered HTTP {exc.status} {exc.reason} while starting your server; nothing "
                "was started and no GPU is held. Try again in a minute; if it keeps failing, tell an admin."
            ) from exc
        except TimeoutError as exc:
            if not self._gpu_api_error:
                raise
            raise ApiUnavailableError(
                f"The Kubernetes API did not create your server's pod ({self._gpu_api_error}); nothing was "
                "started and no GPU is held. Try again in a minute; if it keeps failing, tell an admin."
            ) from exc

    async def _check_and_place(self) -> None:
        """The request checked against the group rules and placed on the cluster's view, now or
        after waiting in the line (refused: GpuRefused)."""
        self._gpu_pod, self._gpu_stages = None, []
        self._gpu_request, self._gpu_placement, self._gpu_card = None, None, None
        # A listing begun after this spawn: pods made since the last one by others (the job dispatcher's, a
        # backfill job's that would yield to this server) are counted, and the spawns of one moment share it.
        await self.cluster(since=time.monotonic())
        try:
            request, image = self.gpu_request()
            self._gpu_request = (request, image)
            self._check_profile()
            mounts = self._model_mounts()
            placed = self._take_turn(request, image, self._wants_to_wait())
        except GpuRefused as refusal:
            self._refused(refusal)
            raise
        if placed is None:  # in line: no pod until the line places it
            await self._wait_in_line(request, image)
        assert self._gpu_placement is not None and self._gpu_cluster is not None  # _rows set it
        group, choice = self._gpu_placement
        self._gpu_held = (time.time(), group) if choice is not None and choice.gpus else None
        card = self._gpu_card = chosen_card(self._gpu_cluster, choice)
        product, uuid = (card.model, card.uuid) if card else ("", "")
        self._apply(request, self.images()[image].target, group, mounts, product, uuid)
        self.log.info("gpuslice: %s asks for %s on %s", self.pod_name, request.describe(), self.gpu_backend)
        CACHES.setdefault(self.namespace, ClusterCache()).forget()  # the next spawn sees this pod

    # -- the line's view of the cluster (spawner/line.py) --------------------------------

    async def _refresh_view(self) -> None:
        await self.cluster()

    def _inventory(self, holds: list[Held]) -> Inventory:
        """The cluster as last listed, with the placements not counted there yet (``holds`` say the same)."""
        assert self._gpu_cluster is not None  # _refresh_view came first
        return self._gpu_cluster

    def _take_turn(self, request: GpuRequest, image: str, wait: bool, joined: bool = False) -> list[Held] | None:
        """The line's turn (spawner/line.py) over the cluster as listed and the placements the ledger holds as it
        begins (made meanwhile by another spawn, or by the job dispatcher); a placement is written with it."""
        placing = self._gpu_turn = Placing()

        def turn(
            rows: list[Held], line: list[Entry], mine: Entry | None, reservations: list[Reservation]
        ) -> tuple[list[Held] | None, Entry | None]:
            self._gpu_cluster = self._counting(placing.seen)
            return self._turn(request, image, wait, self._line_holds(rows), line, mine, reservations, joined)

        return self._ledger.take_turn(self._key, turn, placing)

    def _line_holds(self, rows: list[Held]) -> list[Held]:
        """Every GPU the cluster's pods and the placements not counted yet hold, as ledger rows.

        ``rows``: the ledger's own, always empty here (the pods are the allocations).
        """
        groups = {p.pod: p.group for p in self._gpu_seen}
        for pod in self._gpu_pods or []:
            meta = pod.get("metadata", {})
            groups[meta.get("name", "")] = (meta.get("annotations") or {}).get(GROUP_ANNOTATION)
        held = [
            Held(
                server_key(a.user, a.server), gpu.index, a.user, a.server, a.memory_bytes, a.whole, groups.get(a.owner)
            )
            for gpu, a in self._inventory(rows).allocations()
        ]
        return [h for h in held if h.key != self._key]

    def _decide(self, request: GpuRequest, image: str, holds: list[Held]) -> list[Held]:
        inventory = self._inventory(holds)
        usage = usage_from_pods(self._gpu_pods or [], self.user.name, self.pod_name, self._gpu_seen)
        group, choice = self.check_and_place(request, image, inventory, usage, held_demands(inventory))
        return self._rows(request, inventory, group, choice)

    def _rows(self, request: GpuRequest, inventory: Inventory, group: str | None, choice: Choice | None) -> list[Held]:
        """Placed: note where, and hold the room until the pod is counted (no ledger rows: the pod is the hold)."""
        self._gpu_placement = (group, choice)
        if choice is not None and choice.gpus:
            node = inventory.nodes[choice.node]
            card = node.gpus[choice.gpus[0]].memory_bytes
            whole = request.kind is RequestKind.WHOLE
            allocation = Allocation(
                self.user.name, self.name, card if whole else request.bytes_on(card), self.pod_name, whole
            )
            placed = Pending(
                self.pod_name, node.name, choice.gpus, allocation, group, asked_bytes(request, inventory), time.time()
            )
            assert self._gpu_turn is not None  # _rows runs inside _take_turn's turn
            self._gpu_turn.made.append(placed)  # written with the placement (take_turn)
        return []

    def _forget_placement(self) -> None:
        try:
            self._ledger.forget_placing(self._key)
        except LedgerError as exc:  # kept a day at most; counted only while its pod is listed, or for minutes
            self.log.warning("gpuslice: could not forget the placement of %s: %s", self._key, exc)

    def _end_hold(self) -> None:
        """The pod's hold ends: its time counts in the least-served order (the ledger keeps no pods' rows)."""
        if self._gpu_held is None:
            return
        since, group = self._gpu_held
        self._gpu_held = None
        try:
            self._ledger.end_hold(self._key, self.user.name, group, since, time.time())
        except LedgerError as exc:
            self.log.warning("gpuslice: could not keep the hold of %s: %s", self._key, exc)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self._gpu_held is not None:
            state["gpuslice_held"] = list(self._gpu_held)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        held = state.get("gpuslice_held")
        self._gpu_held = (float(held[0]), held[1]) if held else None

    def _note_api_error(self, error: str) -> None:
        self._gpu_api_error = error
        self.log.warning("gpuslice: creating %s: %s; retrying", self.pod_name, error)

    async def stop(self, now: bool = False) -> None:
        self._forget_placement()
        await self._note_stop()
        self._end_hold()
        await super().stop(now=now)
        if self.sharing_backend().claims:  # its template outlives the pod (the claim goes with the pod)
            await _send(self.api, "DELETE", self._claim_templates_path(self._claim_template_name))

    # -- DRA: the ResourceClaimTemplate beside the pod -------------------------------------

    @property
    def _claim_template_name(self) -> str:
        return f"{self.pod_name}-{CLAIM}"

    def _claim_templates_path(self, name: str = "") -> str:
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaimtemplates"
        return f"{path}/{name}" if name else path

    async def _write_claim_template(self) -> None:
        """Create this spawn's ResourceClaimTemplate (replacing one a previous spawn of the server left)."""
        if not self._gpu_claim:
            return
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": self._claim_template_name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpuslice"},
            },
            "spec": self._gpu_claim,
        }
        if await _send(self.api, "POST", self._claim_templates_path(), template) == 409:
            await _send(self.api, "DELETE", self._claim_templates_path(self._claim_template_name))
            await _send(self.api, "POST", self._claim_templates_path(), template)

    async def _note_stop(self) -> None:
        """Say who stopped this server and why in an Event that outlives the pod (never fails the stop)."""
        try:
            await asyncio.wait_for(self._write_stop_event(), timeout=STOP_NOTE_TIMEOUT_S)
        except Exception as exc:  # a note for people reading Jobs: the stop itself must go on
            self.log.warning("gpuslice: could not note who stopped %s: %s", self.pod_name, exc)

    async def _write_stop_event(self) -> None:
        serialize = self.api.api_client.sanitize_for_serialization
        try:
            pod = serialize(await self.api.read_namespaced_pod(self.pod_name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return  # no pod: nothing ran, nothing to say
            raise
        selector = f"involvedObject.name={self.pod_name}"
        events = serialize(await self.api.list_namespaced_event(self.namespace, field_selector=selector))
        now = time.time()
        asked = stop_request(events.get("items") or [], self.pod_name, now)
        message = stop_message(asked, now, self._last_activity_ts(), self.gpu_culler_timeout)
        note = pod_event(pod, STOPPED, message, "gpuslice-hub", datetime.now(UTC))
        await self.api.create_namespaced_event(self.namespace, note)

    def _check_profile(self) -> None:
        profile = (self.user_options or {}).get("profile")
        allowed = self.gpu_profile_groups.get(profile) if profile else None
        if allowed is None:
            return
        mine = {g.name for g in self.user.groups}
        if not self.user.admin and not set(allowed) & mine:
            raise GpuRefused(403, f"Profile {profile!r} is only for the groups {', '.join(sorted(allowed))}.", "quota")

    def _apply(
        self,
        request: GpuRequest,
        container: str,
        group: str | None,
        mounts: list[dict[str, Any]],
        product: str = "",
        uuid: str = "",
    ) -> None:
        """Decide this spawn's resources, annotations, env, image and volumes (``get_pod_manifest`` adds them).

        KubeSpawner's traits are never changed: each spawn starts from the configuration.
        ``product``, ``uuid``: the GPU product and UUID of the card the placement chose (MIG's profiles
        depend on the product; DRA pins the claim to the UUID).
        """
        card = max((g.memory_bytes for g in self._gpu_cluster.gpus()), default=0) if self._gpu_cluster else 0
        holds_gpu = request.kind is not RequestKind.CPU
        backend = self._gpu_sharing or self.sharing_backend()  # fitted to the cluster as last listed
        target = Target(card_bytes=card or None, product=product, uuid=uuid, group=group)
        spec = backend.render(request, target)
        env = {**spec.env, environ.MODELS_DIR.name: MODELS_DIR}
        if mounts:
            env[environ.MODELS.name] = ",".join(m["mountPath"].rsplit("/", 1)[1] for m in mounts)
        if holds_gpu:  # a use during the GPU line's warning reaches the hub before the reclaimer's stop
            env["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(activity_report_interval(self.gpu_warning_lead))
        self._gpu_pod = PodAdditions(
            limits=dict(spec.limits),
            annotations={**spec.annotations, **({GROUP_ANNOTATION: group} if group else {})},
            env=env,
            image=container,
            scheduler_name=(spec.scheduler_name or self.gpu_scheduler_name) if holds_gpu else "",
            volumes=({"name": MODELS_VOLUME, **self.gpu_models_volume},) if mounts else (),
            volume_mounts=tuple(mounts),
            labels=dict(spec.labels),
            claim_template=self._claim_template_name if spec.claim else "",
        )
        self._gpu_claim = spec.claim
        for warning in spec.warnings:
            self.log.warning("gpuslice: %s: %s", self.pod_name, warning)

    async def get_pod_manifest(self) -> V1Pod:
        """KubeSpawner's pod (from its traits, as configured), with this spawn's additions."""
        pod = await super().get_pod_manifest()
        return add_to_pod(pod, self._gpu_pod) if self._gpu_pod is not None else pod

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        # KubeSpawner's progress follows the start KubeSpawner last began and ends when it is done:
        # while this start still checks and places (or waits in the GPU line), that is the previous
        # spawn's, long finished. The line's place is said meanwhile.
        said = 0
        while self._gpu_placing:
            stages = self._gpu_stages or []
            for stage in stages[said:]:
                yield {"progress": stage.progress, "message": stage.message}
            said = len(stages)
            await asyncio.sleep(0.1)
        async for event in super().progress():
            raw = event.get("raw_event") or {}
            if raw.get("reason") == "FailedScheduling" and self._gpu_request is not None:
                yield {**event, "message": await self._scheduling_explanation(str(raw.get("message", "")))}
            else:
                yield event

    async def _scheduling_explanation(self, message: str) -> str:
        assert self._gpu_request is not None
        request = self._gpu_request[0]
        if request.kind is RequestKind.CPU:
            return f"Waiting for room on a node (scheduler: {message})"
        listed, _ = await self.cluster()
        inventory = without_pod(listed, self.pod_name)  # its own placement is the room it waits for
        demand = Demand.from_request(request)
        room = room_for(demand, inventory)
        if room is not None and self.sharing_backend().claims:
            return scheduling_message(message, unallocated_claim(request, inventory, self._gpu_card, room))
        if room is not None:
            # The hub sees room the scheduler does not: something outside its view holds it.
            return scheduling_message(
                message,
                f"the hub's namespace leaves room for {request.describe()}, but workloads outside it hold "
                "the GPUs; the server starts when one frees up.",
            )
        return scheduling_message(message, str(explain(demand, inventory, request.describe())))


def _forget_failed_reflector(reflectors: dict[Any, Any], key: Any, start: asyncio.Future[Any]) -> None:
    failed = start.cancelled() or start.exception() is not None  # exception() also marks it seen
    loaded = reflectors[key].first_load_future if key in reflectors else None
    if failed and loaded is not None and loaded.done() and (loaded.cancelled() or loaded.exception() is not None):
        reflectors.pop(key, None)


async def _render_form_async(spawner: KubeGpuSpawner) -> str:
    await spawner.cluster()
    return spawner.render_form()
