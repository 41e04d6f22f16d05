"""Nodes -> GPUs -> allocations, built from Kubernetes objects or from local GPUs.

Pure code: the Kubernetes builders take Node and Pod objects as the API returns them
(plain dicts, camelCase keys) and never call the API; the local builder takes the
GPUs and the ledger's allocations. Placement, explanations, metrics and the portal
all read this one model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from spawner.backends import (
    ANNOTATION_MEMORY,
    GPUSHARE_RESOURCE,
    MIG_PREFIX,
    MIG_PROFILES,
    NVIDIA_GPU,
    TIMESLICING_RESOURCE,
    Backend,
    MigProductError,
    MigProfile,
    gpushare_unit_bytes,
    mig_table,
)
from spawner.shares import MiB, ShareError, parse_quantity

# Annotations and labels other tools write (docs/kubernetes.md names the sources read).
GPUSHARE_IDX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_ALLOCATION = "scheduler.framework.gpushare.allocation"
GPUSHARE_COUNT = "aliyun.com/gpu-count"
# gpushare's scheduler extender reads the cards it must skip from this ConfigMap in kube-system.
GPUSHARE_UNHEALTHY_CONFIGMAP = "unhealthy-gpu-{node}"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_NODE = "hami.io/vgpu-node"
HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_HANDSHAKE = "hami.io/node-handshake"
HAMI_CORDON = "hami.io/device-cordon"
HAMI_HANDSHAKE_TIMEOUT = timedelta(seconds=60)
USERNAME = "hub.jupyter.org/username"
GROUP_ANNOTATION = "gpuslice.io/group"  # the group a notebook pod's slice is charged to (spawner.kube writes it)
SERVERNAME = "hub.jupyter.org/servername"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
GFD_COUNT = "nvidia.com/gpu.count"
ALIYUN_MODEL = "aliyun.accelerator/nvidia_name"

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Allocation:
    """What one server holds on one GPU."""

    user: str
    server: str
    memory_bytes: int
    owner: str = ""  # pod name or ledger key
    whole: bool = False


@dataclass
class Gpu:
    node: str
    index: int
    model: str
    memory_bytes: int
    uuid: str = ""
    healthy: bool = True
    simulated: bool = False
    mig_profile: str | None = None
    allocations: list[Allocation] = field(default_factory=list)

    @property
    def allocated_bytes(self) -> int:
        if any(a.whole for a in self.allocations):
            return self.memory_bytes
        return min(self.memory_bytes, sum(a.memory_bytes for a in self.allocations))

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.allocated_bytes

    @property
    def is_free(self) -> bool:
        return self.healthy and not self.allocations


@dataclass
class Node:
    name: str
    cpu_milli: int
    memory_bytes: int
    gpus: list[Gpu] = field(default_factory=list)
    cpu_used_milli: int = 0
    memory_used_bytes: int = 0
    healthy: bool = True
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cpu_free_milli(self) -> int:
        return self.cpu_milli - self.cpu_used_milli

    @property
    def memory_free_bytes(self) -> int:
        return self.memory_bytes - self.memory_used_bytes


@dataclass
class Inventory:
    nodes: list[Node]
    backend: Backend = Backend.LOCAL
    # What could not be read (a malformed annotation, a pod on a node that is gone):
    # the rest of the inventory is still built; callers log these.
    warnings: list[str] = field(default_factory=list)

    def gpus(self) -> Iterable[Gpu]:
        for node in self.nodes:
            yield from node.gpus

    def allocations(self) -> Iterable[tuple[Gpu, Allocation]]:
        for gpu in self.gpus():
            for allocation in gpu.allocations:
                yield gpu, allocation

    @property
    def capacity_bytes(self) -> int:
        return sum(g.memory_bytes for g in self.gpus())

    @property
    def allocated_bytes(self) -> int:
        return sum(g.allocated_bytes for g in self.gpus())


# ---------------------------------------------------------------- local


def build_local(
    gpus: Iterable[Gpu],
    allocations: Iterable[tuple[int, Allocation]] = (),
    *,
    node_name: str = "localhost",
    cpu_milli: int = 0,
    memory_bytes: int = 0,
) -> Inventory:
    """One node holding copies of ``gpus``; ``allocations`` are (GPU index, allocation) pairs.

    ``cpu_milli``/``memory_bytes`` of 0 mean "not limited" (a personal machine). The
    GPUs passed in are not changed, so callers may keep one list for the machine.
    """
    by_index = {gpu.index: replace(gpu, allocations=list(gpu.allocations)) for gpu in gpus}
    for index, allocation in allocations:
        if index not in by_index:
            raise ValueError(
                f"allocation {allocation.owner or allocation.user!r} is on GPU {index}, which does not exist"
            )
        by_index[index].allocations.append(allocation)
    node = Node(
        node_name, cpu_milli or 1 << 40, memory_bytes or 1 << 60, sorted(by_index.values(), key=lambda g: g.index)
    )
    return Inventory([node], Backend.LOCAL)


# ---------------------------------------------------------------- kubernetes


def cpu_milli(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity in millicores: "2" -> 2000, "250m" -> 250."""
    text = str(quantity).strip()
    if text.endswith("m"):
        return int(float(text[:-1]))
    return round(float(text) * 1000)


def memory_bytes(quantity: str | int | float) -> int:
    try:
        return parse_quantity(str(quantity))
    except ShareError as exc:
        raise ValueError(f"bad memory quantity {quantity!r}") from exc


def build_kube(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    backend: Backend,
    *,
    mig_profiles: Mapping[str, tuple[MigProfile, ...]] = MIG_PROFILES,
    timeslicing_resource: str = TIMESLICING_RESOURCE,
    gpushare_memory_unit: str = "GiB",
    config_maps: Iterable[Obj] = (),
    now: datetime | None = None,
) -> Inventory:
    """The inventory of a cluster from its Node and Pod objects (API JSON as dicts).

    ``gpushare_memory_unit`` is gpushare's device plugin ``--memory-unit`` (GiB or MiB);
    ``config_maps`` may hold gpushare's ``unhealthy-gpu-<node>`` ConfigMaps (kube-system);
    ``now`` lets HAMi's expired node handshake take the node's cards away, as HAMi does.
    A pod or node that cannot be read is skipped with a line in ``Inventory.warnings``.
    """
    unit = gpushare_unit_bytes(gpushare_memory_unit)
    inventory = Inventory([], backend)
    unhealthy = _gpushare_unhealthy(config_maps)
    for obj in nodes:
        node = _node(obj, backend, mig_profiles, timeslicing_resource, unit, inventory.warnings)
        if backend is Backend.GPUSHARE:
            for index in unhealthy.get(node.name, ()):
                if 0 <= index < len(node.gpus):
                    node.gpus[index].healthy = False
        elif backend is Backend.HAMI and now is not None and _hami_handshake_expired(obj, now):
            inventory.warnings.append(
                f"node {node.name}: HAMi's device plugin has not answered the handshake for over "
                f"{HAMI_HANDSHAKE_TIMEOUT.seconds}s, so HAMi does not schedule on its cards"
            )
            node.gpus = []
        inventory.nodes.append(node)
    by_name = {node.name: node for node in inventory.nodes}
    for pod in pods:
        bound = by_name.get(pod.get("spec", {}).get("nodeName", ""))
        if bound is not None and holds_resources(pod):
            cpu, memory = _pod_requests(pod)
            bound.cpu_used_milli += cpu
            bound.memory_used_bytes += memory
        gpu_node = _gpu_node(pod, backend)
        if not gpu_node or not _holds_gpus(pod, backend):
            continue
        if gpu_node not in by_name:
            if _asks_for_gpus(pod, backend):
                inventory.warnings.append(f"pod {_pod_key(pod)} holds GPUs on node {gpu_node}, which is gone")
            continue
        try:
            _attach(pod, by_name[gpu_node], backend, timeslicing_resource, unit, inventory.warnings)
        except ValueError as exc:
            inventory.warnings.append(f"pod {_pod_key(pod)}: {exc}; its GPUs are not counted")
    return inventory


@dataclass(frozen=True)
class Pending:
    """A placement the hub decided whose pod the cluster's listing does not count yet.

    A pod is listed only after it is created, and a gpushare, MIG or whole-card pod holds
    its cards only once bound to a node: until then the listing shows its room as free.
    ``gpus`` index ``node``'s cards as in ``Inventory`` (a placement's ``Choice``);
    ``allocation`` is what each of them holds; ``asked_bytes`` is charged to ``group``.
    """

    pod: str
    node: str
    gpus: tuple[int, ...]
    allocation: Allocation
    group: str | None = None
    asked_bytes: int = 0


def add_pending(inventory: Inventory, pending: Iterable[Pending]) -> list[str]:
    """Charge ``inventory`` with the placements it does not count yet; return the pods it counts now.

    A pod the inventory already holds GPUs for (by name) is counted once, as the cluster has
    it: its placement is returned, for the caller to forget.
    """
    counted = {allocation.owner for _, allocation in inventory.allocations()}
    by_name = {node.name: node for node in inventory.nodes}
    landed = []
    for placed in pending:
        if placed.pod in counted:
            landed.append(placed.pod)
            continue
        node = by_name.get(placed.node)
        if node is None:
            continue  # the node is gone: so is the room the placement took
        for index in placed.gpus:
            if 0 <= index < len(node.gpus):
                node.gpus[index].allocations.append(placed.allocation)
    return landed


def holds_resources(pod: Obj) -> bool:
    """Finished pods and pods being deleted hold nothing."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return _phase(pod) not in {"Succeeded", "Failed"}


def _phase(pod: Obj) -> str:
    return str(pod.get("status", {}).get("phase") or "")


def _holds_gpus(pod: Obj, backend: Backend) -> bool:
    """Whether the sharing stack still counts the pod's cards as taken.

    HAMi's scheduler drops a pod only when it has Succeeded or Failed, or is gone: a
    terminating pod keeps its devices (pkg/scheduler/scheduler.go onUpdatePod). The
    others free a pod being deleted at once (gpushare's utils.IsCompletePod).
    """
    if backend is Backend.HAMI:
        return _phase(pod) not in {"Succeeded", "Failed"}
    return holds_resources(pod)


def _gpu_node(pod: Obj, backend: Backend) -> str:
    """The node whose cards the pod holds.

    HAMi charges the node its filter chose (``hami.io/vgpu-node``) from the moment it
    writes it, before the pod is bound; everyone else counts bound pods only.
    """
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if backend is Backend.HAMI:
        return str(annotations.get(HAMI_NODE) or "")
    return str(pod.get("spec", {}).get("nodeName") or "")


def _asks_for_gpus(pod: Obj, backend: Backend) -> bool:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if backend is Backend.HAMI:
        return HAMI_ALLOCATED in annotations
    return any("/" in name for name in _pod_resources(pod))


def _pod_key(pod: Obj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _node(
    obj: Obj,
    backend: Backend,
    mig_profiles: Mapping[str, tuple[MigProfile, ...]],
    ts_resource: str,
    gpushare_unit: int,
    warnings: list[str],
) -> Node:
    meta = obj.get("metadata", {})
    status = obj.get("status", {})
    labels = dict(meta.get("labels") or {})
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    node = Node(
        name=meta["name"],
        cpu_milli=cpu_milli(allocatable.get("cpu", "0")),
        memory_bytes=memory_bytes(allocatable.get("memory", "0")),
        healthy=_ready(obj),
        labels=labels,
    )
    model = labels.get(GFD_PRODUCT) or labels.get(ALIYUN_MODEL) or "unknown"
    if backend is Backend.GPUSHARE:
        # The extender sizes cards from the node's capacity: a card the device plugin
        # reports unhealthy leaves allocatable, not capacity (pkg/utils/node.go).
        node.gpus = _gpushare_gpus(node.name, status.get("capacity") or allocatable, model, gpushare_unit)
    elif backend is Backend.HAMI:
        try:
            node.gpus = _hami_gpus(node.name, meta.get("annotations") or {})
        except ValueError as exc:
            warnings.append(f"node {node.name}: {exc}; HAMi schedules nothing on it either")
    elif backend is Backend.MIG:
        node.gpus = _mig_gpus(node.name, allocatable, model, mig_profiles, warnings)
    else:
        if backend is Backend.TIMESLICING and GFD_COUNT in labels:
            count = int(labels[GFD_COUNT])
        else:
            count = int(allocatable.get(NVIDIA_GPU, 0) or 0)
        card = int(labels.get(GFD_MEMORY, "0") or 0) * MiB
        node.gpus = [Gpu(node.name, i, model, card) for i in range(count)]
    if not node.healthy:
        for gpu in node.gpus:
            gpu.healthy = False
    return node


def _ready(obj: Obj) -> bool:
    if obj.get("spec", {}).get("unschedulable"):
        return False
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _gpushare_gpus(node: str, capacity: Obj, model: str, unit: int) -> list[Gpu]:
    count = int(capacity.get(GPUSHARE_COUNT, 0) or 0)
    total_units = int(capacity.get(GPUSHARE_RESOURCE, 0) or 0)
    if not count:
        return []
    # As the extender's NodeInfo: every card gets total/count units (integer division).
    per_card = total_units // count * unit
    return [Gpu(node, i, model, per_card) for i in range(count)]


def _gpushare_unhealthy(config_maps: Iterable[Obj]) -> dict[str, list[int]]:
    """Node -> card indexes from gpushare's ``unhealthy-gpu-<node>`` ConfigMaps ("gpus": "0,1")."""
    prefix = GPUSHARE_UNHEALTHY_CONFIGMAP.split("{", 1)[0]
    unhealthy: dict[str, list[int]] = {}
    for cm in config_maps:
        meta = cm.get("metadata", {})
        name = str(meta.get("name", ""))
        if meta.get("namespace", "kube-system") != "kube-system" or not name.startswith(prefix):
            continue
        ids = str((cm.get("data") or {}).get("gpus", ""))
        unhealthy[name[len(prefix) :]] = [int(i) for i in ids.split(",") if i.strip().isdigit()]
    return unhealthy


def parse_hami_register(text: str) -> list[dict[str, Any]]:
    """HAMi's node register annotation: Go JSON (current) or "id,count,mem,core,type,numa,health[,index,mode]:".

    The JSON comes from ``json.Marshal`` with ``omitempty`` on every field, so a key
    that is absent is Go's zero value: no ``health`` is an unhealthy card, no ``index``
    is card 0. Raises ValueError for text HAMi itself could not decode.
    """
    text = text.strip()
    if text.startswith("["):
        try:
            devices = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bad {HAMI_REGISTER} JSON: {exc}") from exc
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ValueError(f"bad {HAMI_REGISTER}: expected a JSON list of devices")
        return [{"index": 0, "health": False, **d} for d in devices]
    if ":" not in text:
        raise ValueError(f"bad {HAMI_REGISTER}: no device separator ':'")
    return [_hami_register_entry(entry) for entry in text.split(":") if entry]


def _hami_register_entry(entry: str) -> dict[str, Any]:
    fields = entry.split(",")
    if len(fields) not in (7, 9):
        raise ValueError(f"bad {HAMI_REGISTER} entry {entry!r}: HAMi expects 7 or 9 fields, not {len(fields)}")
    try:
        return {
            "id": fields[0],
            "count": int(fields[1]),
            "devmem": int(fields[2]),
            "devcore": int(fields[3]),
            "type": fields[4],
            "numa": int(fields[5]),
            "health": _go_bool(fields[6]),
            "index": int(fields[7]) if len(fields) == 9 else 0,
            "mode": fields[8] if len(fields) == 9 else "hami-core",
        }
    except ValueError as exc:
        raise ValueError(f"bad {HAMI_REGISTER} entry {entry!r}: {exc}") from exc


def _go_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in {"1", "t", "T", "TRUE", "true", "True"}:
        return True
    if text in {"0", "f", "F", "FALSE", "false", "False"}:
        return False
    raise ValueError(f"{text!r} is not a boolean")


def _hami_gpus(node: str, annotations: Obj) -> list[Gpu]:
    register = annotations.get(HAMI_REGISTER)
    if not register:
        return []
    cordoned = {u.strip() for u in str(annotations.get(HAMI_CORDON, "")).split(",") if u.strip()}
    gpus = []
    for device in parse_hami_register(register):
        uuid = str(device.get("id", ""))
        gpus.append(
            Gpu(
                node,
                int(device.get("index") or 0),
                str(device.get("type", "unknown")),
                int(device.get("devmem", 0) or 0) * MiB,
                uuid=uuid,
                # HAMi's Fit skips unhealthy and cordoned devices alike.
                healthy=bool(device.get("health")) and uuid not in cordoned,
            )
        )
    return gpus


def _hami_handshake_expired(obj: Obj, now: datetime) -> bool:
    """HAMi's CheckHealth: "Requesting_<time>" unanswered for 60 s while the node offers no GPUs."""
    meta = obj.get("metadata", {})
    handshake = str((meta.get("annotations") or {}).get(HAMI_HANDSHAKE, ""))
    if "Requesting" not in handshake or "_" not in handshake:
        return False
    try:
        asked = datetime.strptime(handshake.split("_", 1)[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return False  # HAMi keeps a node whose handshake time it cannot read
    if now.astimezone(UTC) < asked + HAMI_HANDSHAKE_TIMEOUT:
        return False
    allocatable = obj.get("status", {}).get("allocatable") or {}
    return not int(allocatable.get(NVIDIA_GPU, 0) or 0)


def mig_profile_bytes(name: str, table: tuple[MigProfile, ...]) -> int:
    """Memory of a MIG instance from its card's profile table (0: a profile the card does not have)."""
    return next((p.memory_mib * MiB for p in table if p.name == name), 0)


def _mig_gpus(
    node: str,
    allocatable: Obj,
    model: str,
    mig_profiles: Mapping[str, tuple[MigProfile, ...]],
    warnings: list[str],
) -> list[Gpu]:
    resources = sorted((r, c) for r, c in allocatable.items() if r.startswith(MIG_PREFIX))
    if not resources:
        return []
    try:
        table = mig_table(model, mig_profiles)
    except MigProductError as exc:
        warnings.append(f"node {node}: {exc}; its MIG instances are left out")
        return []
    gpus: list[Gpu] = []
    for resource, count in resources:
        profile = resource[len(MIG_PREFIX) :]
        size = mig_profile_bytes(profile, table)
        if not size:
            warnings.append(f"node {node}: {model} has no MIG profile {profile!r}; those instances are left out")
            continue
        for _ in range(int(count)):
            gpus.append(Gpu(node, len(gpus), model, size, mig_profile=profile))
    return gpus


def _pod_requests(pod: Obj) -> tuple[int, int]:
    cpu = memory = 0
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        cpu += cpu_milli(requests.get("cpu", 0))
        memory += memory_bytes(requests.get("memory", 0))
    return cpu, memory


def _pod_limit(pod: Obj, resource: str) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get(resource, 0) or 0)
    return total


def _owner(pod: Obj) -> tuple[str, str, str]:
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    user = annotations.get(USERNAME) or labels.get(USERNAME) or ""
    return user, annotations.get(SERVERNAME, ""), meta.get("name", "")


def _attach(pod: Obj, node: Node, backend: Backend, ts_resource: str, gpushare_unit: int, warnings: list[str]) -> None:
    user, server, name = _owner(pod)
    annotations = pod.get("metadata", {}).get("annotations") or {}

    def add(gpu: Gpu, amount: int, is_whole: bool = False) -> None:
        gpu.allocations.append(Allocation(user, server, amount, name, is_whole))

    if backend is Backend.HAMI:
        # HAMi's nvidia.com/gpu counts vGPUs, not whole cards: only its annotation says what is held.
        by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
        for uuid, mib in hami_pod_usage(pod).items():
            if uuid in by_uuid:
                add(by_uuid[uuid], mib * MiB)
            else:
                warnings.append(f"pod {_pod_key(pod)} holds {uuid}, which node {node.name} does not register")
        return
    if backend is Backend.GPUSHARE:
        for index, units in _gpushare_placement(pod, annotations):
            if 0 <= index < len(node.gpus):
                add(node.gpus[index], units * gpushare_unit)
            else:
                warnings.append(f"pod {_pod_key(pod)} is on card {index}, which node {node.name} does not have")
    elif backend is Backend.MIG:
        for resource in _pod_resources(pod):
            if resource.startswith(MIG_PREFIX):
                profile = resource[len(MIG_PREFIX) :]
                for gpu in node.gpus:
                    if gpu.mig_profile == profile and not gpu.allocations:
                        add(gpu, gpu.memory_bytes, True)
                        break
    elif backend is Backend.TIMESLICING and _pod_limit(pod, ts_resource):
        # The device plugin does not say which card a replica is on: charge the
        # card with the most free memory, as its round-robin tends to.
        slice_bytes = int(annotations.get(ANNOTATION_MEMORY, 0) or 0)
        if node.gpus:
            add(max(node.gpus, key=lambda g: (g.free_bytes, -g.index)), slice_bytes)
    whole = _pod_limit(pod, NVIDIA_GPU)
    if whole and backend is not Backend.MIG:
        # The device plugin does not report which cards; take the first free ones.
        for gpu in [g for g in node.gpus if not g.allocations][:whole]:
            add(gpu, gpu.memory_bytes, True)


def _pod_resources(pod: Obj) -> list[str]:
    names: list[str] = []
    for container in pod.get("spec", {}).get("containers") or []:
        names.extend(((container.get("resources") or {}).get("limits") or {}).keys())
    return names


def _gpushare_placement(pod: Obj, annotations: Obj) -> list[tuple[int, int]]:
    """(card index, units) pairs as gpushare's extender counts them.

    Only pods whose containers (not init containers) ask for aliyun.com/gpu-mem count;
    the card is ALIYUN_COM_GPU_MEM_IDX and the amount ALIYUN_COM_GPU_MEM_POD, written
    by the extender before it binds (ALIYUN_COM_GPU_MEM_ASSIGNED "false" still counts).
    A missing or unreadable amount counts 0 and an unreadable card nothing, as there
    (pkg/utils/pod.go GetGPUIDFromAnnotation, GetGPUMemoryFromPodAnnotation).
    """
    if annotations.get(GPUSHARE_ALLOCATION):
        # Written by neither the extender nor the device plugin read here; kept for builds
        # that write it: {"container index": {"card": units}}.
        try:
            allocation = json.loads(annotations[GPUSHARE_ALLOCATION])
            return [(int(i), int(u)) for c in allocation.values() for i, u in c.items()]
        except (ValueError, AttributeError, TypeError) as exc:
            raise ValueError(f"bad {GPUSHARE_ALLOCATION} {annotations[GPUSHARE_ALLOCATION]!r}") from exc
    if _pod_limit(pod, GPUSHARE_RESOURCE) <= 0 or GPUSHARE_IDX not in annotations:
        return []
    try:
        index = int(annotations[GPUSHARE_IDX])
    except ValueError as exc:
        raise ValueError(f"bad {GPUSHARE_IDX} {annotations[GPUSHARE_IDX]!r}") from exc
    return [(index, max(0, _atoi(annotations.get(GPUSHARE_POD, ""))))]


def _atoi(text: str) -> int:
    """Go's strconv.Atoi with the error ignored, as gpushare reads ALIYUN_COM_GPU_MEM_POD."""
    try:
        return int(text)
    except ValueError:
        return 0


def parse_hami_pod_devices(text: str) -> list[list[tuple[str, int]]]:
    """Per container, (uuid, MiB) pairs from "uuid,type,mem,cores:uuid,...:;..." (HAMi's DecodePodDevices).

    Containers are split by ';' and kept in order, empty ones included (init
    containers first, then the others); a device entry without a comma is skipped,
    as HAMi skips it; one with fewer than 4 fields or a non-number is an error.
    """
    containers = []
    for container in text.split(";"):
        devices = []
        for device in container.split(":"):
            if "," not in device:
                continue
            fields = device.split(",")
            if len(fields) < 4:
                raise ValueError(f"bad {HAMI_ALLOCATED} entry {device!r}: HAMi expects uuid,type,memory,cores")
            try:
                mib = int(fields[2])
                int(fields[3])  # HAMi refuses the pod's annotation over a bad core count too
            except ValueError as exc:
                raise ValueError(f"bad {HAMI_ALLOCATED} entry {device!r}: {exc}") from exc
            devices.append((fields[0], mib))
        containers.append(devices)
    return containers


def hami_pod_usage(pod: Obj) -> dict[str, int]:
    """MiB a pod holds on each card, as HAMi's scheduler charges it (pkg/device/initContainer.go).

    Init containers run one at a time, so a card is charged the larger of the init
    containers' peak and the other containers' sum; once every init container has
    succeeded only the other containers count.
    """
    text = (pod.get("metadata", {}).get("annotations") or {}).get(HAMI_ALLOCATED)
    if not text:
        return {}
    inits = len(pod.get("spec", {}).get("initContainers") or [])
    init_peak: dict[str, int] = {}
    app_sum: dict[str, int] = {}
    for position, devices in enumerate(parse_hami_pod_devices(text)):
        for uuid, mib in devices:
            if position < inits:
                init_peak[uuid] = max(init_peak.get(uuid, 0), mib)
            else:
                app_sum[uuid] = app_sum.get(uuid, 0) + mib
    if _init_containers_succeeded(pod):
        return app_sum
    return {uuid: max(init_peak.get(uuid, 0), app_sum.get(uuid, 0)) for uuid in {**init_peak, **app_sum}}


def _init_containers_succeeded(pod: Obj) -> bool:
    """HAMi's util.AllInitContainersSucceeded: some init container status, each terminated with 0."""
    statuses = pod.get("status", {}).get("initContainerStatuses") or []
    exits = [((s.get("state") or {}).get("terminated") or {}).get("exitCode") for s in statuses]
    return bool(exits) and all(code == 0 for code in exits)
