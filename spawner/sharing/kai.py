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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

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
