"""NVIDIA KAI Scheduler (NVIDIA/KAI-Scheduler): GPU fractions, queues, its own placement.

A pod names ``schedulerName: kai-scheduler`` and its queue in the label ``kai.scheduler/queue``
(a class's queue: its group's name unless ``queues`` maps it, else ``default-queue``); a
slice is the annotation ``gpu-memory`` (MiB) or ``gpu-fraction`` (a share of the card).
KAI places it: its binder reserves the card with a reservation pod in the
``kai-resource-reservation`` namespace (label ``runai-gpu-group``, annotation
``run.ai/reserve_for_gpu_index`` with the card's UUID, one ``nvidia.com/gpu``) and labels the
fractional pod with the same ``runai-gpu-group``. KAI does not cap memory: the framework
hook does. Whole cards are ``nvidia.com/gpu`` limits, scheduled by KAI too. Sources:
pkg/common/constants/constants.go, pkg/binder/binding/resourcereservation/resource_reservation.go,
pkg/resourcereservation/patcher/pod_patcher.go, docs/gpu-sharing/*.yaml,
docs/quickstart/default-queues.yaml (tests/spawner/sharing/fixtures/kai_*.yaml cite the commit).

A class's queue as its teachers read it (``read_queue``): the Queue's spec (parent, GPU quota and
limit in cards, -1 for none) and the status KAI's controllers write (pkg/apis/scheduling/v2/queue_types.go:
``allocated`` and ``requested``, ResourceLists summed from the queue's pod groups and child queues by
pkg/queuecontroller; a fraction counts as ``nvidia.com/gpu`` in cards, a ``gpu-memory`` request as
``run.ai/gpu.memory`` in MiB: pkg/podgroupcontroller/controllers/resources), with the queue's pods KAI
has not placed and its reason, from their PodScheduled condition
(pkg/scheduler/cache/status_updater/default_status_updater.go).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from spawner.inventory import Gpu, Node, holds_resources
from spawner.shares import GpuRequest, MiB
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    NO_ISOLATION_WARNING,
    NVIDIA_GPU,
    ApiList,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    allocation,
    annotations_of,
    attach_whole_cards,
    pod_key,
    pod_limit,
    pod_owner,
    slice_env,
    whole_cards,
)

SCHEDULER = "kai-scheduler"
QUEUE_LABEL = "kai.scheduler/queue"
DEFAULT_QUEUE = "default-queue"  # docs/quickstart/default-queues.yaml
GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"  # MiB
GPU_GROUP = "runai-gpu-group"
RESERVED_UUID = "run.ai/reserve_for_gpu_index"  # the card's UUID, written by the reservation pod
RESERVATION_NAMESPACE = "kai-resource-reservation"
RESERVATIONS = ApiList("kai-reservations", f"/api/v1/namespaces/{RESERVATION_NAMESPACE}/pods")
QUEUES_PATH = "/apis/scheduling.run.ai/v2/queues"  # cluster-scoped: deployments/kai-scheduler/crds
REQUESTED_MEMORY = "run.ai/gpu.memory"  # MiB a queue's gpu-memory pods ask for, in status.requested
NOT_TRIED = "KAI has not tried to place it yet"

NOTE = (
    "A slice is a KAI Scheduler fraction of a GPU: KAI reserves your share but does not hold its memory; "
    "gpuslice caps PyTorch, TensorFlow, JAX and CuPy in your kernels to your slice, but other CUDA code can "
    "use more."
)


@dataclass(frozen=True)
class Kai(SharingBackend):
    name = "kai"
    slice_note = NOTE
    reads = (RESERVATIONS,)

    queues: Mapping[str, str] = field(default_factory=dict)  # group -> KAI queue (default: the group's name)
    default_queue: str = DEFAULT_QUEUE  # for a server charged to no group

    def queue(self, group: str | None) -> str:
        return self.queues.get(group, group) if group else self.default_queue

    # -- the pod ------------------------------------------------------------------------

    def render_whole(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        spec = whole_cards(request, self.name)
        return ServerGpuSpec(
            limits=spec.limits,
            annotations=spec.annotations,
            env=spec.env,
            isolation=spec.isolation,
            labels={QUEUE_LABEL: self.queue(target.group)},
            scheduler_name=SCHEDULER,
        )

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        annotations = {ANNOTATION_BACKEND: self.name}
        if request.memory_bytes is not None:
            mib = max(1, math.ceil(request.memory_bytes / MiB))
            annotations[GPU_MEMORY] = str(mib)
            held = mib * MiB
        else:
            assert request.fraction is not None
            annotations[GPU_FRACTION] = f"{request.fraction:g}"
            held = request.bytes_on(target.card_bytes) if target.card_bytes else 0
        if held:
            annotations[ANNOTATION_MEMORY] = str(held)
        return ServerGpuSpec(
            annotations=annotations,
            env=slice_env(held, target.card_bytes, Isolation.NONE) if held else {},
            warnings=(NO_ISOLATION_WARNING,),
            isolation=Isolation.NONE,
            labels={QUEUE_LABEL: self.queue(target.group)},
            scheduler_name=SCHEDULER,
        )

    # -- the inventory ------------------------------------------------------------------

    def attach_all(self, listing: Listing, by_name: Mapping[str, Node], warnings: list[str]) -> None:
        """Whole-card pods first, then each reservation pod takes a card (by its UUID where the card has one,
        else the first card nothing holds) and the fractional pods of its GPU group share that card."""
        mine = [p for p in listing.pods if holds_resources(p) and p.get("spec", {}).get("nodeName") in by_name]
        for pod in mine:
            if pod_limit(pod, NVIDIA_GPU) and not _group(pod):
                attach_whole_cards(pod, by_name[pod["spec"]["nodeName"]])
        cards: dict[tuple[str, str], Gpu] = {}
        for reservation in sorted(listing.objects.get(RESERVATIONS.key, ()), key=_created):
            node = by_name.get(reservation.get("spec", {}).get("nodeName", ""))
            group = _group(reservation)
            if node is None or not group or not holds_resources(reservation):
                continue
            uuid = str(annotations_of(reservation).get(RESERVED_UUID, ""))
            taken = [id(g) for g in cards.values()]
            card = next((g for g in node.gpus if uuid and g.uuid == uuid), None) or next(
                (g for g in node.gpus if not g.allocations and id(g) not in taken), None
            )
            if card is None:
                warnings.append(f"KAI's reservation pod {pod_key(reservation)} holds a card node {node.name} lacks")
                continue
            if uuid and not card.uuid:
                card.uuid = uuid
            cards[(node.name, group)] = card
        for pod in mine:
            group = _group(pod)
            if not group:
                continue
            card = cards.get((pod["spec"]["nodeName"], group))
            if card is None:
                warnings.append(f"pod {pod_key(pod)} is in KAI's GPU group {group}, which no reservation pod holds")
                continue
            card.allocations.append(allocation(pod, fraction_bytes(pod, card.memory_bytes)))

    def asks_for_gpus(self, pod: Obj) -> bool:
        return bool(_group(pod)) or super().asks_for_gpus(pod)


def _group(pod: Obj) -> str:
    return str((pod.get("metadata", {}).get("labels") or {}).get(GPU_GROUP) or "")


def _created(pod: Obj) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return str(meta.get("creationTimestamp", "")), str(meta.get("name", ""))


def fraction_bytes(pod: Obj, card_bytes: int) -> int:
    """What a fractional pod holds of its card: ``gpu-memory`` MiB, else ``gpu-fraction`` of the card."""
    annotations = annotations_of(pod)
    if annotations.get(GPU_MEMORY):
        return int(annotations[GPU_MEMORY]) * MiB
    return int(float(annotations.get(GPU_FRACTION, 0) or 0) * card_bytes)


# -- a class's queue --------------------------------------------------------------------


@dataclass(frozen=True)
class QueuedPod:
    """A pod of the queue that KAI has not placed, and why, in KAI's words."""

    user: str
    server: str
    pod: str
    reason: str


@dataclass(frozen=True)
class ClassQueue:
    """A class's KAI queue as KAI keeps it. GPU amounts in cards (0.25: a quarter of one); a quota or limit
    of -1 is none, None is unset. ``waiting``: the queue's pods of the namespace read that KAI has not placed."""

    name: str
    exists: bool = True
    parent: str = ""
    gpu_quota: float | None = None
    gpu_limit: float | None = None
    allocated_gpus: float = 0.0
    requested_gpus: float = 0.0
    requested_memory_bytes: int = 0
    waiting: tuple[QueuedPod, ...] = ()


def read_queue(name: str, queue: Obj | None, pods: Iterable[Obj]) -> ClassQueue:
    """The queue ``name`` from its Queue object (None: KAI has no such queue) and the pods that name it."""
    waiting = tuple(
        QueuedPod(*pod_owner(pod), reason=_unplaced_reason(pod))
        for pod in sorted(pods, key=_created)
        if _queue_of(pod) == name and holds_resources(pod) and not pod.get("spec", {}).get("nodeName")
    )
    if queue is None:
        return ClassQueue(name, exists=False, waiting=waiting)
    spec, status = queue.get("spec") or {}, queue.get("status") or {}
    gpu = (spec.get("resources") or {}).get("gpu") or {}
    allocated, requested = status.get("allocated") or {}, status.get("requested") or {}
    return ClassQueue(
        name,
        parent=str(spec.get("parentQueue") or ""),
        gpu_quota=_number(gpu.get("quota")),
        gpu_limit=_number(gpu.get("limit")),
        allocated_gpus=count_of(allocated.get(NVIDIA_GPU, 0)),
        requested_gpus=count_of(requested.get(NVIDIA_GPU, 0)),
        requested_memory_bytes=round(count_of(requested.get(REQUESTED_MEMORY, 0)) * MiB),
        waiting=waiting,
    )


_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def count_of(quantity: object) -> float:
    """A Kubernetes quantity as a number ("250m": 0.25, "666666667n", "4096"); unreadable counts 0, as the
    inventory counts an unreadable amount."""
    found = _QUANTITY.match(str(quantity).strip())
    if found is None:
        return 0.0
    number, exponent, suffix = found.group(1), found.group(2), found.group(3) or ""
    try:
        value = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        return 0.0
    if suffix.endswith("i"):
        return float(value * 1024 ** ("KMGTPE".index(suffix[0]) + 1))
    return float(value.scaleb(int(exponent) if exponent else _DECIMAL_SUFFIX[suffix]))


def _number(value: object) -> float | None:
    try:
        return float(value) if value is not None else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _queue_of(pod: Obj) -> str:
    return str((pod.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL) or "")


def _unplaced_reason(pod: Obj) -> str:
    """KAI's message on the pod's PodScheduled condition (it writes the same in an Unschedulable event)."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or NOT_TRIED)
    return NOT_TRIED
