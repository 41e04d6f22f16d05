"""A sharing backend that exists only in tests, added the way any backend is: one file, one ``register``.

"Acme vGPU", an imaginary device plugin: a node offers ``acme.example/cards`` cards of
``acme.example/card-mib`` MiB each (a node label), a pod asks for ``acme.example/vram: <MiB>``
and the plugin writes the card it gave in the pod's ``acme.example/card`` annotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spawner import sharing
from spawner.inventory import Gpu, Node
from spawner.shares import GpuRequest, MiB
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    allocation,
    annotations_of,
    node_allocatable,
    node_model,
    pod_limit,
    slice_bytes,
    slice_env,
)

CARDS = "acme.example/cards"
CARD_MIB = "acme.example/card-mib"
VRAM = "acme.example/vram"
CARD = "acme.example/card"


@sharing.register
@dataclass(frozen=True)
class Acme(SharingBackend):
    name = "acme"
    slice_note = "A slice is held to its memory by Acme's driver."

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        mib = math.ceil(slice_bytes(request, target.card_bytes, self.name) / MiB)
        return ServerGpuSpec(
            limits={VRAM: str(mib)},
            annotations={ANNOTATION_BACKEND: self.name, ANNOTATION_MEMORY: str(mib * MiB)},
            env=slice_env(mib * MiB, target.card_bytes, Isolation.SOFTWARE),
            isolation=Isolation.SOFTWARE,
        )

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        count = int(node_allocatable(obj).get(CARDS, 0) or 0)
        mib = int((obj["metadata"].get("labels") or {}).get(CARD_MIB, 0))
        return [Gpu(node, i, node_model(obj), mib * MiB) for i in range(count)]

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        card = annotations_of(pod).get(CARD)
        if card is not None:
            node.gpus[int(card)].allocations.append(allocation(pod, pod_limit(pod, VRAM) * MiB))
