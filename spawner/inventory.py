"""Nodes -> GPUs -> allocations, built from Kubernetes objects or from local GPUs.

Pure code: the Kubernetes builders take Node and Pod objects as the API returns them
(plain dicts, camelCase keys) and never call the API; the local builder takes the
GPUs and the ledger's allocations. Placement, explanations, metrics and the portal
all read this one model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spawner.backends import (
    ANNOTATION_MEMORY,
    GPUSHARE_RESOURCE,
    MIG_PREFIX,
    MIG_PROFILES,
    NVIDIA_GPU,
    TIMESLICING_RESOURCE,
    Backend,
    MigProfile,
)
from spawner.shares import GiB, MiB, ShareError, parse_quantity

# Annotations and labels other tools write.
GPUSHARE_IDX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_ALLOCATION = "scheduler.framework.gpushare.allocation"
GPUSHARE_COUNT = "aliyun.com/gpu-count"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_REGISTER = "hami.io/node-nvidia-register"
USERNAME = "hub.jupyter.org/username"
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
) -> Inventory:
    """The inventory of a cluster from its Node and Pod objects (API JSON as dicts)."""
    inventory = Inventory([_node(obj, backend, mig_profiles, timeslicing_resource) for obj in nodes], backend)
    by_name = {node.name: node for node in inventory.nodes}
    for pod in pods:
        node = by_name.get(pod.get("spec", {}).get("nodeName", ""))
        if node is None or not holds_resources(pod):
            continue
        cpu, memory = _pod_requests(pod)
        node.cpu_used_milli += cpu
        node.memory_used_bytes += memory
        _attach(pod, node, backend, timeslicing_resource)
    return inventory


def holds_resources(pod: Obj) -> bool:
    """Finished pods and pods being deleted hold nothing."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return pod.get("status", {}).get("phase") not in {"Succeeded", "Failed"}


def _node(obj: Obj, backend: Backend, mig_profiles: Mapping[str, tuple[MigProfile, ...]], ts_resource: str) -> Node:
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
        node.gpus = _gpushare_gpus(node.name, allocatable, model)
    elif backend is Backend.HAMI:
        node.gpus = _hami_gpus(node.name, meta.get("annotations") or {})
    elif backend is Backend.MIG:
        node.gpus = _mig_gpus(node.name, allocatable, model, mig_profiles)
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


def _gpushare_gpus(node: str, allocatable: Obj, model: str) -> list[Gpu]:
    count = int(allocatable.get(GPUSHARE_COUNT, 0) or 0)
    total_gib = int(allocatable.get(GPUSHARE_RESOURCE, 0) or 0)
    if not count:
        return []
    # gpushare reports the node's total in whole GiB; every card gets an equal share.
    per_card = total_gib // count * GiB
    return [Gpu(node, i, model, per_card) for i in range(count)]


def parse_hami_register(text: str) -> list[dict[str, Any]]:
    """HAMi's node register annotation: JSON (newer) or "id,count,mem,core,type,numa,health:" (older)."""
    text = text.strip()
    if text.startswith("["):
        return [dict(d) for d in json.loads(text)]
    devices = []
    for entry in filter(None, (part.strip() for part in text.split(":"))):
        fields = entry.split(",")
        if len(fields) < 5:
            raise ValueError(f"bad {HAMI_REGISTER} entry {entry!r}")
        devices.append(
            {
                "id": fields[0],
                "count": int(fields[1]),
                "devmem": int(fields[2]),
                "devcore": int(fields[3]),
                "type": fields[4],
                "health": fields[6].lower() == "true" if len(fields) > 6 else True,
            }
        )
    return devices


def _hami_gpus(node: str, annotations: Obj) -> list[Gpu]:
    register = annotations.get(HAMI_REGISTER)
    if not register:
        return []
    return [
        Gpu(
            node,
            index,
            str(device.get("type", "unknown")),
            int(device.get("devmem", 0)) * MiB,
            uuid=str(device.get("id", "")),
            healthy=bool(device.get("health", True)),
        )
        for index, device in enumerate(parse_hami_register(register))
    ]


def mig_profile_bytes(name: str, mig_profiles: Mapping[str, tuple[MigProfile, ...]], model: str) -> int:
    """Memory of a MIG instance: from the profile table, else the number in its name (GB)."""
    for card, profiles in mig_profiles.items():
        if card.lower() in model.lower() or not model:
            for profile in profiles:
                if profile.name == name:
                    return profile.memory_mib * MiB
    match = re.search(r"\.(\d+)gb$", name)
    return int(match.group(1)) * 1000**3 if match else 0


def _mig_gpus(node: str, allocatable: Obj, model: str, mig_profiles: Mapping[str, tuple[MigProfile, ...]]) -> list[Gpu]:
    gpus: list[Gpu] = []
    for resource, count in sorted(allocatable.items()):
        if not resource.startswith(MIG_PREFIX):
            continue
        profile = resource[len(MIG_PREFIX) :]
        size = mig_profile_bytes(profile, mig_profiles, model)
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


def _attach(pod: Obj, node: Node, backend: Backend, ts_resource: str) -> None:
    user, server, name = _owner(pod)
    annotations = pod.get("metadata", {}).get("annotations") or {}
    whole = _pod_limit(pod, NVIDIA_GPU)

    def add(gpu: Gpu, amount: int, is_whole: bool = False) -> None:
        gpu.allocations.append(Allocation(user, server, amount, name, is_whole))

    if backend is Backend.GPUSHARE:
        for index, gib in _gpushare_placement(pod, annotations):
            if 0 <= index < len(node.gpus):
                add(node.gpus[index], gib * GiB)
    elif backend is Backend.HAMI and annotations.get(HAMI_ALLOCATED):
        by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
        for uuid, mib in parse_hami_allocated(annotations[HAMI_ALLOCATED]):
            if uuid in by_uuid:
                add(by_uuid[uuid], mib * MiB)
        return
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
    """(card index, GiB) pairs from gpushare's annotations."""
    if annotations.get(GPUSHARE_ALLOCATION):
        pairs: list[tuple[int, int]] = []
        for per_container in json.loads(annotations[GPUSHARE_ALLOCATION]).values():
            pairs.extend((int(idx), int(gib)) for idx, gib in per_container.items())
        return pairs
    if GPUSHARE_IDX in annotations:
        gib = int(annotations.get(GPUSHARE_POD) or _pod_limit(pod, GPUSHARE_RESOURCE))
        return [(int(annotations[GPUSHARE_IDX]), gib)]
    return []


def parse_hami_allocated(text: str) -> list[tuple[str, int]]:
    """(uuid, MiB) pairs from "uuid,type,mem,cores:uuid,...:;" (containers split by ';')."""
    pairs = []
    for container in text.split(";"):
        for device in filter(None, (d.strip() for d in container.split(":"))):
            fields = device.split(",")
            if len(fields) < 3:
                raise ValueError(f"bad {HAMI_ALLOCATED} entry {device!r}")
            pairs.append((fields[0], int(fields[2])))
    return pairs
