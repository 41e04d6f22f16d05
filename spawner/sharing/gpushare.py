"""gpushare (AliyunContainerService/gpushare-scheduler-extender and gpushare-device-plugin; ACK cGPU).

A slice is ``aliyun.com/gpu-mem`` units (GiB by default; the device plugin's
``--memory-unit=MiB`` makes them MiB; with no unit set it is inferred from the nodes as
gpushare's own ``kubectl inspect gpushare`` does). gpushare's extender writes the card it chose in
``ALIYUN_COM_GPU_MEM_IDX`` and the units in ``ALIYUN_COM_GPU_MEM_POD`` before binding (its
pkg/utils/const.go and pod.go); a node's cards are ``aliyun.com/gpu-count`` of its capacity,
each ``aliyun.com/gpu-mem / count`` units. Nothing in open source enforces the memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from spawner.inventory import Gpu, Node
from spawner.placement import Demand
from spawner.shares import GiB, GpuRequest, MiB
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    NO_ISOLATION_WARNING,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    allocation,
    annotations_of,
    attach_whole_cards,
    needs_card,
    node_allocatable,
    node_model,
    pod_key,
    pod_limit,
    slice_env,
)

RESOURCE = "aliyun.com/gpu-mem"
COUNT = "aliyun.com/gpu-count"
# gpushare-scheduler-extender, pkg/utils/const.go
IDX = "ALIYUN_COM_GPU_MEM_IDX"
POD = "ALIYUN_COM_GPU_MEM_POD"
DEV = "ALIYUN_COM_GPU_MEM_DEV"
ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ALLOCATION = "scheduler.framework.gpushare.allocation"
# gpushare's scheduler extender reads the cards it must skip from this ConfigMap in kube-system.
UNHEALTHY_CONFIGMAP = "unhealthy-gpu-{node}"
# The device plugin's --memory-unit: what one aliyun.com/gpu-mem is ("": inferred from the nodes).
UNITS = {"GiB": GiB, "MiB": MiB}
DEFAULT_UNIT = "GiB"  # the device plugin's default, where no node says otherwise
# kubectl-inspect-gpushare (gpushare-device-plugin, cmd/inspect/nodeinfo.go setUnit): a card
# counting more than this many units is counted in MiB, otherwise in GiB.
MIB_ABOVE_UNITS_PER_CARD = 100


def unit_bytes(memory_unit: str) -> int:
    """Bytes in one aliyun.com/gpu-mem unit for gpushare's device plugin ``--memory-unit`` ("": the default)."""
    if memory_unit and memory_unit not in UNITS:
        raise ValueError(
            f"gpushare memory unit must be one of {', '.join(UNITS)} (the device plugin's "
            f"--memory-unit), or empty to infer it from the nodes, not {memory_unit!r}"
        )
    return UNITS[memory_unit or DEFAULT_UNIT]


def inferred_unit(nodes: Sequence[Obj]) -> tuple[str, str]:
    """The unit the nodes' aliyun.com/gpu-mem is counted in, and the node it was read from ("", "": none
    offers it), as ``kubectl inspect gpushare`` infers it: the first node with cards, its allocatable
    units per card, more than 100 is MiB (a 16 GB card is 15 GiB or 15109 MiB)."""
    for node in nodes:
        allocatable = node_allocatable(node)
        count = int(allocatable.get(COUNT, 0) or 0)
        total = int(allocatable.get(RESOURCE, 0) or 0)
        if count and total:
            unit = "MiB" if total // count > MIB_ABOVE_UNITS_PER_CARD else "GiB"
            return unit, str(node["metadata"]["name"])
    return "", ""


def card_units(card_bytes: int, memory_unit: str = "GiB") -> int:
    """gpushare's unit count for a card: its MiB, floored to whole GiB with GiB (a 16 GB card is 15)."""
    return (card_bytes // MiB) // (unit_bytes(memory_unit) // MiB)


@dataclass(frozen=True)
class Gpushare(SharingBackend):
    name = "gpushare"
    extender = True

    memory_unit: str = ""  # the device plugin's --memory-unit; "": inferred from the nodes (fit)

    def __post_init__(self) -> None:
        unit_bytes(self.memory_unit)  # refuses an unknown unit with the allowed ones

    @property
    def unit(self) -> int:
        return unit_bytes(self.memory_unit)

    def fit(self, listing: Listing) -> tuple[SharingBackend, list[str]]:
        """The unit inferred from the nodes where none is set; a unit set overrides it, with a warning
        when the nodes read otherwise (pods would ask for 1024 times too much or too little)."""
        inferred, node = inferred_unit(listing.nodes)
        if not self.memory_unit:
            return replace(self, memory_unit=inferred or DEFAULT_UNIT), []
        if inferred and inferred != self.memory_unit:
            per_card = per_card_units(next(n for n in listing.nodes if n["metadata"]["name"] == node), allocatable=True)
            return self, [
                f"gpushare's memory unit is set to {self.memory_unit} (gpuSharing.gpushareMemoryUnit), but node "
                f"{node} offers {per_card} aliyun.com/gpu-mem per card, which gpushare's own inspect tool reads "
                f"as {inferred}; {self.memory_unit} is used as set: check the device plugin's --memory-unit, or "
                "leave the setting empty to infer it"
            ]
        return self, []

    # -- the pod ------------------------------------------------------------------------

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        if request.memory_bytes is not None:
            # Round up: the slice must hold what was asked for.
            units = max(1, math.ceil(request.memory_bytes / self.unit))
        else:
            assert request.fraction is not None
            if target.card_bytes is None:
                raise needs_card(request, self.name)
            # Round down: four quarters must fit on the card as gpushare counts it.
            units = max(1, math.floor(request.fraction * card_units(target.card_bytes, self.memory_unit)))
        held = units * self.unit
        return ServerGpuSpec(
            limits={RESOURCE: str(units)},
            annotations={ANNOTATION_MEMORY: str(held), ANNOTATION_BACKEND: self.name},
            env=slice_env(held, target.card_bytes, Isolation.NONE),
            warnings=(NO_ISOLATION_WARNING,),
            isolation=Isolation.NONE,
        )

    # -- the inventory ------------------------------------------------------------------

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        # The extender sizes cards from the node's capacity: a card the device plugin
        # reports unhealthy leaves allocatable, not capacity (pkg/utils/node.go).
        status = obj.get("status", {})
        capacity = status.get("capacity") or status.get("allocatable") or {}
        count = int(capacity.get(COUNT, 0) or 0)
        if not count:
            return []
        # As the extender's NodeInfo: every card gets total/count units (integer division).
        per_card = int(capacity.get(RESOURCE, 0) or 0) // count * self.unit
        gpus = [Gpu(node, i, node_model(obj), per_card) for i in range(count)]
        for index in unhealthy_cards(listing.objects.get("configmaps", ()), node):
            if 0 <= index < len(gpus):
                gpus[index].healthy = False
        return gpus

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        for index, units in placement(pod):
            if 0 <= index < len(node.gpus):
                node.gpus[index].allocations.append(allocation(pod, units * self.unit))
            else:
                warnings.append(f"pod {pod_key(pod)} is on card {index}, which node {node.name} does not have")
        attach_whole_cards(pod, node)

    # -- the extender -------------------------------------------------------------------

    def gpu_demand(self, pod: Obj, base: Demand) -> Demand:
        units = pod_limit(pod, RESOURCE)
        return replace(base, slice_units=float(units * self.unit)) if units else super().gpu_demand(pod, base)

    def bind_annotations(
        self, pod: Obj, node: Obj, gpus: Sequence[Gpu], taken: Sequence[float], now_ns: int
    ) -> dict[str, str]:
        if not pod_limit(pod, RESOURCE):
            return {}
        (gpu,) = gpus
        return {
            IDX: str(gpu.index),
            POD: str(pod_limit(pod, RESOURCE)),
            DEV: str(per_card_units(node)),
            ASSIGNED: "false",
            ASSUME_TIME: str(now_ns),
        }


def per_card_units(node: Obj, allocatable: bool = False) -> int:
    """Memory per card in the device plugin's own unit, as gpushare's extender computes it
    (total / count of the node's capacity; ``allocatable``: of what it offers now, as its inspect
    tool reads it), so the unit (GiB or MiB) is whatever it reports."""
    status = node.get("status", {})
    counted = status.get("capacity") or status.get("allocatable") or {}
    capacity = node_allocatable(node) if allocatable else counted
    cards = int(capacity.get(COUNT, 0) or 0)
    return int(capacity.get(RESOURCE, 0) or 0) // cards if cards else 0


def unhealthy_cards(config_maps: Iterable[Obj], node: str) -> list[int]:
    """Card indexes from gpushare's ``unhealthy-gpu-<node>`` ConfigMap in kube-system ("gpus": "0,1")."""
    wanted = UNHEALTHY_CONFIGMAP.format(node=node)
    cards: list[int] = []
    for cm in config_maps:
        meta = cm.get("metadata", {})
        if meta.get("namespace", "kube-system") == "kube-system" and meta.get("name") == wanted:
            ids = str((cm.get("data") or {}).get("gpus", ""))
            cards = [int(i) for i in ids.split(",") if i.strip().isdigit()]
    return cards


def placement(pod: Obj) -> list[tuple[int, int]]:
    """(card index, units) pairs as gpushare's extender counts them.

    Only pods whose containers (not init containers) ask for aliyun.com/gpu-mem count;
    the card is ALIYUN_COM_GPU_MEM_IDX and the amount ALIYUN_COM_GPU_MEM_POD, written
    by the extender before it binds (ALIYUN_COM_GPU_MEM_ASSIGNED "false" still counts).
    A missing or unreadable amount counts 0 and an unreadable card nothing, as there
    (pkg/utils/pod.go GetGPUIDFromAnnotation, GetGPUMemoryFromPodAnnotation).
    """
    annotations = annotations_of(pod)
    if annotations.get(ALLOCATION):
        # Written by neither the extender nor the device plugin read here; kept for builds
        # that write it: {"container index": {"card": units}}.
        try:
            written = json.loads(annotations[ALLOCATION])
            return [(int(i), int(u)) for c in written.values() for i, u in c.items()]
        except (ValueError, AttributeError, TypeError) as exc:
            raise ValueError(f"bad {ALLOCATION} {annotations[ALLOCATION]!r}") from exc
    if pod_limit(pod, RESOURCE) <= 0 or IDX not in annotations:
        return []
    try:
        index = int(annotations[IDX])
    except ValueError as exc:
        raise ValueError(f"bad {IDX} {annotations[IDX]!r}") from exc
    return [(index, max(0, _atoi(annotations.get(POD, ""))))]


def _atoi(text: str) -> int:
    """Go's strconv.Atoi with the error ignored, as gpushare reads ALIYUN_COM_GPU_MEM_POD."""
    try:
        return int(text)
    except ValueError:
        return 0
