"""The one interface every sharing backend implements, and what all of them share.

A backend is a class (a frozen dataclass whose fields are its settings, such as gpushare's
memory unit) with three kinds of knowledge, each a method here with the behaviour of a
plain device plugin (whole cards asked for as ``nvidia.com/gpu``) as its default:

- **the pod**: ``render`` turns a request into the container's limits, the pod's
  annotations and labels, the environment, and any object the pod needs first;
- **the inventory**: ``read_cluster`` turns the cluster's objects (Nodes and Pods as the API
  returns them, plus the other kinds the backend lists in ``reads``) into cards and
  allocations, through the hooks ``node_gpus``, ``gpu_node``, ``holds_gpus`` and ``attach``;
- **the extender**: ``gpu_demand`` (what a pod asks for, as placement counts it) and
  ``bind_annotations`` (the card written where the device plugin reads it).

And the words the spawn form shows for its slices (``slice_note``).
Pure code: no I/O, the objects come in as plain dicts (camelCase keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from spawner import environ
from spawner.inventory import (
    SERVERNAME,
    USERNAME,
    Allocation,
    Gpu,
    Inventory,
    Node,
    cpu_milli,
    holds_resources,
    memory_bytes,
)
from spawner.placement import Demand
from spawner.shares import GpuRequest, MiB, RequestKind, ShareError

Obj = Mapping[str, Any]

# The environment the kernel-side hook reads (spawner/kernel_hook/gpuslice_limits.py).
ENV_BYTES = environ.GPU_MEMORY_BYTES.name
ENV_FRACTION = environ.GPU_MEMORY_FRACTION.name
ENV_ISOLATION = environ.ISOLATION.name
# Our own record of the slice on the pod: the inventory reads it back on backends whose
# device plugin does not annotate the pod (time-slicing), the group rules count it.
ANNOTATION_MEMORY = "gpuslice.io/gpu-memory-bytes"
ANNOTATION_BACKEND = "gpuslice.io/sharing-backend"
NVIDIA_GPU = "nvidia.com/gpu"
# Labels other tools write on nodes (GPU feature discovery; Alibaba's ACK for its model name).
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
GFD_COUNT = "nvidia.com/gpu.count"
ALIYUN_MODEL = "aliyun.accelerator/nvidia_name"


class Isolation(StrEnum):
    """Who enforces the slice: the hardware, a software layer, or nobody."""

    HARDWARE = "hardware"
    SOFTWARE = "software"
    NONE = "none"


NO_ISOLATION_WARNING = (
    "This GPU is shared without memory isolation: your kernels are held to your slice by "
    "gpuslice's framework hook (PyTorch, TensorFlow, JAX, CuPy), but other CUDA code can "
    "use more and disturb the other users of the card."
)
NO_ISOLATION_NOTE = (
    "A slice is shared without memory isolation: gpuslice caps PyTorch, TensorFlow, JAX and CuPy "
    "in your kernels to your slice, but other CUDA code can use more."
)


@dataclass(frozen=True)
class ServerGpuSpec:
    """What a server needs from its backend. Builders return fresh dicts."""

    limits: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    isolation: Isolation = Isolation.HARDWARE
    labels: dict[str, str] = field(default_factory=dict)  # the pod's (KAI's queue)
    scheduler_name: str = ""  # the scheduler the backend needs for GPU pods ("": the spawner's setting)
    # A ResourceClaimTemplate's ``spec`` (DRA): the spawner creates the template before the pod,
    # names it after the pod and gives the pod's container the claim made from it.
    claim: dict[str, Any] | None = None


@dataclass(frozen=True)
class Target:
    """Where placement put the server, as far as the spawner knows it when it renders the pod."""

    card_bytes: int | None = None  # the memory of the card the slice goes to
    product: str = ""  # that card's GPU product label (MIG's profiles depend on it)
    devices: tuple[str, ...] = ()  # one machine: the CUDA ids of the chosen cards
    uuid: str = ""  # the chosen card's UUID where the cluster publishes it (DRA pins the claim to it)
    group: str | None = None  # the class the slice is charged to (KAI's queue)


@dataclass(frozen=True)
class ApiList:
    """A list of API objects a backend reads besides nodes and pods (``key`` names it in ``Listing``)."""

    key: str
    path: str  # the REST path of the list, e.g. /apis/resource.k8s.io/v1/resourceslices


@dataclass(frozen=True)
class Listing:
    """The cluster's objects the inventory is read from (API JSON as dicts)."""

    nodes: Sequence[Obj]
    pods: Sequence[Obj]
    objects: Mapping[str, Sequence[Obj]] = field(default_factory=dict)  # by ApiList.key
    now: datetime | None = None  # for state that expires (HAMi's node handshake)


def slice_env(slice_bytes: int, card_bytes: int | None, isolation: Isolation) -> dict[str, str]:
    """The env the kernel-side hook reads; the fraction only when the card is known."""
    env = {ENV_BYTES: str(slice_bytes), ENV_ISOLATION: isolation.value}
    if card_bytes:
        fraction = min(1.0, slice_bytes / card_bytes)
        env[ENV_FRACTION] = f"{fraction:.6f}"
        # JAX reads this itself at start; TensorFlow is capped by the hook.
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.6f}"
    return env


def cpu_only() -> ServerGpuSpec:
    # Both: the NVIDIA container runtime reads the first, CUDA itself the second.
    return ServerGpuSpec(env={"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""})


def needs_card(request: GpuRequest, backend: str) -> ShareError:
    return ShareError(
        f"A share of a card ({request.fraction:g}) needs the card's size on the {backend} backend; "
        'ask for memory instead, for example "4GiB".'
    )


def slice_bytes(request: GpuRequest, card_bytes: int | None, backend: str) -> int:
    """The bytes a slice request holds: its memory, or its share of the card (which must be known)."""
    if request.memory_bytes is not None:
        return request.memory_bytes
    if card_bytes is None:
        raise needs_card(request, backend)
    return request.bytes_on(card_bytes)


def whole_cards(request: GpuRequest, backend: str = "whole") -> ServerGpuSpec:
    """Whole cards through the NVIDIA device plugin's ``nvidia.com/gpu``: every backend's whole-card request."""
    if request.kind is RequestKind.SLICE:
        raise ShareError(
            'This cluster gives out whole GPUs only; ask for gpus=1 (and gpu_memory "0") '
            "or ask your admin to enable a sharing backend."
        )
    return ServerGpuSpec(
        limits={NVIDIA_GPU: str(request.gpus)},
        annotations={ANNOTATION_BACKEND: backend},
        env={ENV_ISOLATION: Isolation.HARDWARE.value},
        isolation=Isolation.HARDWARE,
    )


# ---------------------------------------------------------------- reading Kubernetes objects


def annotations_of(obj: Obj) -> Obj:
    return obj.get("metadata", {}).get("annotations") or {}


def phase(pod: Obj) -> str:
    return str(pod.get("status", {}).get("phase") or "")


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def containers(pod: Obj) -> list[Obj]:
    return list(pod.get("spec", {}).get("containers") or [])


def pod_limit(pod: Obj, resource: str) -> int:
    """The sum of the containers' (not init containers') limits of ``resource``."""
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(resource, 0) or 0) for c in containers(pod))


def pod_resources(pod: Obj) -> list[str]:
    return [name for c in containers(pod) for name in ((c.get("resources") or {}).get("limits") or {})]


def pod_owner(pod: Obj) -> tuple[str, str, str]:
    """(user, server name, pod name) from KubeSpawner's annotations and labels."""
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    user = annotations.get(USERNAME) or labels.get(USERNAME) or ""
    return user, annotations.get(SERVERNAME, ""), meta.get("name", "")


def allocation(pod: Obj, memory: int, whole: bool = False) -> Allocation:
    user, server, name = pod_owner(pod)
    return Allocation(user, server, memory, name, whole)


def pod_requests(pod: Obj) -> tuple[int, int]:
    """CPU (millicores) and memory (bytes) the pod's containers ask for (limits where no request)."""
    cpu = memory = 0
    for container in containers(pod):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        cpu += cpu_milli(asked.get("cpu", 0))
        memory += memory_bytes(asked.get("memory", 0))
    return cpu, memory


def node_ready(obj: Obj) -> bool:
    if obj.get("spec", {}).get("unschedulable"):
        return False
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_allocatable(obj: Obj) -> Obj:
    status = obj.get("status", {})
    return status.get("allocatable") or status.get("capacity") or {}


def node_model(obj: Obj) -> str:
    labels = obj.get("metadata", {}).get("labels") or {}
    return str(labels.get(GFD_PRODUCT) or labels.get(ALIYUN_MODEL) or "unknown")


def node_of(obj: Obj) -> Node:
    """A Node object's name, CPU, memory, health and labels (its cards are the backend's to read)."""
    meta = obj.get("metadata", {})
    allocatable = node_allocatable(obj)
    return Node(
        name=meta["name"],
        cpu_milli=cpu_milli(allocatable.get("cpu", "0")),
        memory_bytes=memory_bytes(allocatable.get("memory", "0")),
        healthy=node_ready(obj),
        labels=dict(meta.get("labels") or {}),
    )


def attach_whole_cards(pod: Obj, node: Node) -> None:
    """A pod's ``nvidia.com/gpu`` cards: the device plugin does not say which, so the first free ones."""
    wanted = pod_limit(pod, NVIDIA_GPU)
    for gpu in [g for g in node.gpus if not g.allocations][:wanted]:
        gpu.allocations.append(allocation(pod, gpu.memory_bytes, True))


# ---------------------------------------------------------------- the interface


@dataclass(frozen=True)
class SharingBackend:
    """One way a cluster (or this machine) shares GPUs. Subclasses override what differs."""

    name: ClassVar[str]
    slice_note: ClassVar[str] = NO_ISOLATION_NOTE  # what the spawn form says of slices ("": none offered)
    kubernetes: ClassVar[bool] = True  # a choice for KubeGpuSpawner.gpu_backend
    extender: ClassVar[bool] = False  # gpuslice's scheduler extender can place and bind for it
    reads: ClassVar[tuple[ApiList, ...]] = ()  # lists the inventory needs besides nodes and pods
    claims: ClassVar[bool] = False  # its pods claim their GPU from a ResourceClaimTemplate the spawner writes

    # -- the pod ------------------------------------------------------------------------

    def render(self, request: GpuRequest, target: Target = Target()) -> ServerGpuSpec:
        """The limits, annotations, env and warnings for ``request``; ShareError for one it cannot express."""
        if request.kind is RequestKind.CPU:
            return cpu_only()
        if request.kind is RequestKind.WHOLE:
            return self.render_whole(request, target)
        return self.render_slice(request, target)

    def render_whole(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        return whole_cards(request)

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        return whole_cards(request)  # refuses slices with advice

    # -- the inventory ------------------------------------------------------------------

    def fit(self, listing: Listing) -> tuple[SharingBackend, list[str]]:
        """This backend with the settings the cluster itself shows (gpushare's memory unit), and what
        disagrees with the settings given. Render and read with the backend it returns."""
        return self, []

    def read_cluster(self, listing: Listing) -> Inventory:
        """The cluster's nodes, cards and allocations. A pod or node that cannot be read is
        skipped with a line in ``Inventory.warnings``; the rest is still read."""
        inventory = Inventory([], self.name)
        for obj in listing.nodes:
            node = node_of(obj)
            try:
                node.gpus = self.node_gpus(obj, node.name, listing, inventory.warnings)
            except ValueError as exc:
                inventory.warnings.append(f"node {node.name}: {exc}; its cards are left out")
            if not node.healthy:
                for gpu in node.gpus:
                    gpu.healthy = False
            inventory.nodes.append(node)
        by_name = {node.name: node for node in inventory.nodes}
        for pod in listing.pods:
            bound = by_name.get(pod.get("spec", {}).get("nodeName", ""))
            if bound is not None and holds_resources(pod):
                cpu, memory = pod_requests(pod)
                bound.cpu_used_milli += cpu
                bound.memory_used_bytes += memory
        self.attach_all(listing, by_name, inventory.warnings)
        return inventory

    def attach_all(self, listing: Listing, by_name: Mapping[str, Node], warnings: list[str]) -> None:
        """Charge the cards with what each pod holds (``gpu_node``, ``holds_gpus``, ``attach``)."""
        for pod in listing.pods:
            gpu_node = self.gpu_node(pod)
            if not gpu_node or not self.holds_gpus(pod):
                continue
            if gpu_node not in by_name:
                if self.asks_for_gpus(pod):
                    warnings.append(f"pod {pod_key(pod)} holds GPUs on node {gpu_node}, which is gone")
                continue
            try:
                self.attach(pod, by_name[gpu_node], warnings)
            except ValueError as exc:
                warnings.append(f"pod {pod_key(pod)}: {exc}; its GPUs are not counted")

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        """The cards a Node object offers: ``nvidia.com/gpu`` of GPU feature discovery's memory."""
        labels = obj.get("metadata", {}).get("labels") or {}
        count = int(node_allocatable(obj).get(NVIDIA_GPU, 0) or 0)
        return self.sized_cards(node, count, obj, labels)

    @staticmethod
    def sized_cards(node: str, count: int, obj: Obj, labels: Obj) -> list[Gpu]:
        card = int(labels.get(GFD_MEMORY, "0") or 0) * MiB
        return [Gpu(node, i, node_model(obj), card) for i in range(count)]

    def gpu_node(self, pod: Obj) -> str:
        """The node whose cards the pod holds: the one it is bound to."""
        return str(pod.get("spec", {}).get("nodeName") or "")

    def holds_gpus(self, pod: Obj) -> bool:
        """Whether the sharing stack still counts the pod's cards as taken (finished and deleted pods: no)."""
        return holds_resources(pod)

    def asks_for_gpus(self, pod: Obj) -> bool:
        return any("/" in name for name in pod_resources(pod))

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        """Charge ``node``'s cards with what ``pod`` holds there."""
        attach_whole_cards(pod, node)

    # -- the extender -------------------------------------------------------------------

    def gpu_demand(self, pod: Obj, base: Demand) -> Demand:
        """``base`` (the pod's CPU, memory and model) with the GPUs it asks for as placement counts them."""
        return replace(base, gpus=pod_limit(pod, NVIDIA_GPU))

    def bind_annotations(
        self, pod: Obj, node: Obj, gpus: Sequence[Gpu], taken: Sequence[float], now_ns: int
    ) -> dict[str, str]:
        """What binding ``pod`` to the chosen ``gpus`` of ``node`` writes on it (``taken``: the bytes
        it takes of each) so that the device plugin uses those cards. Nothing for whole cards."""
        return {}
