"""HAMi (Project-HAMi/HAMi): vGPUs with memory enforced by HAMi-core in the container.

A slice is ``nvidia.com/gpu: 1`` (one vGPU) with ``nvidia.com/gpumem`` (MiB) or
``nvidia.com/gpumem-percentage``, optionally ``nvidia.com/gpucores``. A node registers its
cards in ``hami.io/node-nvidia-register``; HAMi's scheduler writes the cards it gives a pod in
``hami.io/vgpu-devices-allocated`` and charges the node it chose (``hami.io/vgpu-node``) from
that moment, before the pod is bound (pkg/scheduler/scheduler.go, pkg/device/devices.go,
pkg/device/nvidia/device.go, pkg/util/types.go).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from spawner.inventory import Gpu, Node
from spawner.placement import Demand
from spawner.shares import GpuRequest, MiB, ShareError
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    ENV_ISOLATION,
    NVIDIA_GPU,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    allocation,
    annotations_of,
    node_allocatable,
    phase,
    pod_key,
    pod_limit,
    slice_env,
)

GPU = NVIDIA_GPU  # counts vGPUs on a HAMi node, not whole cards
MEMORY = "nvidia.com/gpumem"
MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
NODE = "hami.io/vgpu-node"
TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
CORDON = "hami.io/device-cordon"
HANDSHAKE_TIMEOUT = timedelta(seconds=60)
NVIDIA = "NVIDIA"  # the device type HAMi writes for NVIDIA cards

NOTE = (
    "A slice is enforced by HAMi in your server: any CUDA code that asks for more memory than your "
    "slice gets an out-of-memory error instead."
)


@dataclass(frozen=True)
class Hami(SharingBackend):
    name = "hami"
    slice_note = NOTE
    extender = True

    cores_percent: int | None = None  # nvidia.com/gpucores for every slice; None: not limited

    # -- the pod ------------------------------------------------------------------------

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        limits = {GPU: "1"}
        if request.memory_bytes is not None:
            mib = max(1, math.ceil(request.memory_bytes / MiB))
            limits[MEMORY] = str(mib)
            held = mib * MiB
        else:
            assert request.fraction is not None
            # HAMi resolves a percentage against whichever card it picks.
            limits[MEMORY_PERCENT] = str(max(1, math.floor(request.fraction * 100)))
            held = request.bytes_on(target.card_bytes) if target.card_bytes else 0
        if self.cores_percent is not None:
            if not 1 <= self.cores_percent <= 100:
                raise ShareError(f"hami cores must be a percentage from 1 to 100, not {self.cores_percent}.")
            limits[CORES] = str(self.cores_percent)
        env = (
            slice_env(held, target.card_bytes, Isolation.SOFTWARE)
            if held
            else {ENV_ISOLATION: Isolation.SOFTWARE.value}
        )
        annotations = {ANNOTATION_BACKEND: self.name}
        if held:
            annotations[ANNOTATION_MEMORY] = str(held)
        return ServerGpuSpec(limits=limits, annotations=annotations, env=env, isolation=Isolation.SOFTWARE)

    # -- the inventory ------------------------------------------------------------------

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        annotations = annotations_of(obj)
        try:
            gpus = register_gpus(node, annotations)
        except ValueError as exc:
            warnings.append(f"node {node}: {exc}; HAMi schedules nothing on it either")
            gpus = []
        if listing.now is not None and handshake_expired(obj, listing.now):
            warnings.append(
                f"node {node}: HAMi's device plugin has not answered the handshake for over "
                f"{HANDSHAKE_TIMEOUT.seconds}s, so HAMi does not schedule on its cards"
            )
            return []
        return gpus

    def gpu_node(self, pod: Obj) -> str:
        """HAMi charges the node its filter chose from the moment it writes it, before the pod is bound."""
        return str(annotations_of(pod).get(NODE) or "")

    def holds_gpus(self, pod: Obj) -> bool:
        """HAMi's scheduler drops a pod only when it has Succeeded or Failed, or is gone: a
        terminating pod keeps its devices (pkg/scheduler/scheduler.go onUpdatePod)."""
        return phase(pod) not in {"Succeeded", "Failed"}

    def asks_for_gpus(self, pod: Obj) -> bool:
        return ALLOCATED in annotations_of(pod)

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        # HAMi's nvidia.com/gpu counts vGPUs, not whole cards: only its annotation says what is held.
        by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
        for uuid, mib in pod_usage(pod).items():
            if uuid in by_uuid:
                by_uuid[uuid].allocations.append(allocation(pod, mib * MiB))
            else:
                warnings.append(f"pod {pod_key(pod)} holds {uuid}, which node {node.name} does not register")

    # -- the extender -------------------------------------------------------------------

    def gpu_demand(self, pod: Obj, base: Demand) -> Demand:
        if pod_limit(pod, GPU) == 1 and pod_limit(pod, MEMORY):
            return replace(base, slice_units=float(pod_limit(pod, MEMORY) * MiB))
        if pod_limit(pod, GPU) == 1 and pod_limit(pod, MEMORY_PERCENT):
            return replace(base, slice_fraction=pod_limit(pod, MEMORY_PERCENT) / 100)
        return super().gpu_demand(pod, base)

    def bind_annotations(
        self, pod: Obj, node: Obj, gpus: Sequence[Gpu], taken: Sequence[float], now_ns: int
    ) -> dict[str, str]:
        if not gpus:
            return {}
        cores = pod_limit(pod, CORES)
        devices = "".join(
            f"{gpu.uuid},{NVIDIA},{int(amount) // MiB},{cores}:" for gpu, amount in zip(gpus, taken, strict=True)
        )
        value = devices + ";"  # one container asks for the devices (EncodePodSingleDevice)
        seconds = str(now_ns // 1_000_000_000)
        return {
            TO_ALLOCATE: value,
            ALLOCATED: value,
            NODE: node["metadata"]["name"],
            TIME: seconds,
            BIND_PHASE: "allocating",
            BIND_TIME: seconds,
        }


# ---------------------------------------------------------------- the node register


def parse_register(text: str) -> list[dict[str, Any]]:
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
            raise ValueError(f"bad {REGISTER} JSON: {exc}") from exc
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ValueError(f"bad {REGISTER}: expected a JSON list of devices")
        return [{"index": 0, "health": False, **d} for d in devices]
    if ":" not in text:
        raise ValueError(f"bad {REGISTER}: no device separator ':'")
    return [_register_entry(entry, position) for position, entry in enumerate(e for e in text.split(":") if e)]


def _register_entry(entry: str, position: int) -> dict[str, Any]:
    """One card of the text register. The seven-field entries of HAMi before v2.5 carry no index
    (pkg/util/util.go EncodeNodeDevices before commit 68d9037): the device plugin wrote the cards
    in NVML's order, so an entry's position is its card index (HAMi's own decoder says 0 for every
    one; it finds cards by UUID, but here two cards at index 0 would be one card)."""
    fields = entry.split(",")
    if len(fields) not in (7, 9):
        raise ValueError(f"bad {REGISTER} entry {entry!r}: HAMi expects 7 or 9 fields, not {len(fields)}")
    try:
        return {
            "id": fields[0],
            "count": int(fields[1]),
            "devmem": int(fields[2]),
            "devcore": int(fields[3]),
            "type": fields[4],
            "numa": int(fields[5]),
            "health": _go_bool(fields[6]),
            "index": int(fields[7]) if len(fields) == 9 else position,
            "mode": fields[8] if len(fields) == 9 else "hami-core",
        }
    except ValueError as exc:
        raise ValueError(f"bad {REGISTER} entry {entry!r}: {exc}") from exc


def _go_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in {"1", "t", "T", "TRUE", "true", "True"}:
        return True
    if text in {"0", "f", "F", "FALSE", "false", "False"}:
        return False
    raise ValueError(f"{text!r} is not a boolean")


def register_gpus(node: str, annotations: Obj) -> list[Gpu]:
    register = annotations.get(REGISTER)
    if not register:
        return []
    cordoned = {u.strip() for u in str(annotations.get(CORDON, "")).split(",") if u.strip()}
    gpus = []
    for device in parse_register(register):
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


def handshake_expired(obj: Obj, now: datetime) -> bool:
    """HAMi's CheckHealth: "Requesting_<time>" unanswered for 60 s while the node offers no GPUs."""
    handshake = str(annotations_of(obj).get(HANDSHAKE, ""))
    if "Requesting" not in handshake or "_" not in handshake:
        return False
    try:
        asked = datetime.strptime(handshake.split("_", 1)[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return False  # HAMi keeps a node whose handshake time it cannot read
    if now.astimezone(UTC) < asked + HANDSHAKE_TIMEOUT:
        return False
    return not int(node_allocatable(obj).get(GPU, 0) or 0)


# ---------------------------------------------------------------- a pod's devices


def parse_pod_devices(text: str) -> list[list[tuple[str, int]]]:
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
                raise ValueError(f"bad {ALLOCATED} entry {device!r}: HAMi expects uuid,type,memory,cores")
            try:
                mib = int(fields[2])
                int(fields[3])  # HAMi refuses the pod's annotation over a bad core count too
            except ValueError as exc:
                raise ValueError(f"bad {ALLOCATED} entry {device!r}: {exc}") from exc
            devices.append((fields[0], mib))
        containers.append(devices)
    return containers


def pod_usage(pod: Obj) -> dict[str, int]:
    """MiB a pod holds on each card, as HAMi's scheduler charges it (pkg/device/initContainer.go).

    Init containers run one at a time, so a card is charged the larger of the init
    containers' peak and the other containers' sum; once every init container has
    succeeded only the other containers count.
    """
    text = annotations_of(pod).get(ALLOCATED)
    if not text:
        return {}
    inits = len(pod.get("spec", {}).get("initContainers") or [])
    init_peak: dict[str, int] = {}
    app_sum: dict[str, int] = {}
    for position, devices in enumerate(parse_pod_devices(text)):
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
