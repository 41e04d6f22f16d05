"""Time-slicing (NVIDIA's device plugin with ``sharing.timeSlicing``): replicas of a card, no isolation.

A slice is one replica, ``nvidia.com/gpu.shared: 1`` (``renameByDefault``) or
``nvidia.com/gpu`` where the replicas keep the plain name. The plugin does not say which
card a replica is on, so the pod carries its slice in gpuslice's own annotation.
"""

from __future__ import annotations

from dataclasses import dataclass

from spawner.inventory import Gpu, Node
from spawner.shares import GpuRequest
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    GFD_COUNT,
    NO_ISOLATION_WARNING,
    NVIDIA_GPU,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    allocation,
    annotations_of,
    attach_whole_cards,
    node_allocatable,
    pod_limit,
    slice_bytes,
    slice_env,
)

RESOURCE = "nvidia.com/gpu.shared"


@dataclass(frozen=True)
class Timeslicing(SharingBackend):
    name = "timeslicing"

    resource: str = RESOURCE  # the replicas' resource name

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        held = slice_bytes(request, target.card_bytes, self.name)
        return ServerGpuSpec(
            limits={self.resource: "1"},
            annotations={ANNOTATION_MEMORY: str(held), ANNOTATION_BACKEND: self.name},
            env=slice_env(held, target.card_bytes, Isolation.NONE),
            warnings=(NO_ISOLATION_WARNING,),
            isolation=Isolation.NONE,
        )

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        """The physical cards: GPU feature discovery's count (allocatable counts the replicas)."""
        labels = obj.get("metadata", {}).get("labels") or {}
        count = int(labels[GFD_COUNT] if GFD_COUNT in labels else node_allocatable(obj).get(NVIDIA_GPU, 0) or 0)
        return self.sized_cards(node, count, obj, labels)

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        if pod_limit(pod, self.resource) and node.gpus:
            # The device plugin does not say which card a replica is on: charge the
            # card with the most free memory, as its round-robin tends to.
            held = int(annotations_of(pod).get(ANNOTATION_MEMORY, 0) or 0)
            gpu = max(node.gpus, key=lambda g: (g.free_bytes, -g.index))
            gpu.allocations.append(allocation(pod, held))
        attach_whole_cards(pod, node)
