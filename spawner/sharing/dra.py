"""Dynamic Resource Allocation (``resource.k8s.io/v1``) with NVIDIA's DRA driver (``gpu.nvidia.com``).

A server's GPU is a ResourceClaimTemplate the spawner creates beside the pod (named after
it); Kubernetes makes the pod's ResourceClaim from it and the scheduler allocates a device:

- whole cards: ``count`` devices of the ``gpu.nvidia.com`` DeviceClass;
- a slice, ``slices: mps`` (default) or ``timeslicing``: one GPU of that class with
  ``capacity.requests.memory`` (Kubernetes' consumable capacity: the GPU must be published
  with ``allowMultipleAllocations``), pinned to the card gpuslice's placement chose by a CEL
  selector on its UUID, and the driver's ``GpuConfig`` sharing it by MPS with the slice as the
  pinned-memory limit of the claim (enforced) or by time-slicing (not enforced);
- a slice, ``slices: mig``: one device of the ``mig.nvidia.com`` class whose profile is the
  smallest of the chosen card that holds it.

The inventory is read from the driver's ResourceSlices (each device's ``type``, ``uuid``,
``productName``, ``profile`` and ``parentUUID`` attributes, ``memory`` capacity) and the
allocated ResourceClaims (``status.allocation.devices.results`` and their ``consumedCapacity``;
the owner is the pod in ``status.reservedFor``, else the claim's owning pod). Shapes from
kubernetes/api ``resource/v1/types.go`` and the driver's ``cmd/gpu-kubelet-plugin`` and
``demo/specs/quickstart/v1`` (tests/spawner/sharing/fixtures/dra_*.yaml cite the commits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spawner.inventory import Allocation, Gpu, Inventory, holds_resources
from spawner.shares import GpuRequest, MiB, ShareError, parse_quantity
from spawner.sharing import mig
from spawner.sharing.base import (
    ANNOTATION_BACKEND,
    ANNOTATION_MEMORY,
    ENV_ISOLATION,
    NO_ISOLATION_WARNING,
    ApiList,
    Isolation,
    Listing,
    Obj,
    ServerGpuSpec,
    SharingBackend,
    Target,
    node_of,
    pod_owner,
    pod_requests,
    slice_bytes,
    slice_env,
)

GROUP_VERSION = "resource.k8s.io/v1"
SLICES = ApiList("resourceslices", f"/apis/{GROUP_VERSION}/resourceslices")
CLAIMS = ApiList("resourceclaims", f"/apis/{GROUP_VERSION}/resourceclaims")
REQUEST = "gpu"  # the claim's one request, and the pod's claim name
GPU_CONFIG_VERSION = "resource.nvidia.com/v1beta1"  # the driver's opaque GpuConfig (api/nvidia.com/resource)
MODES = {"mps": Isolation.SOFTWARE, "timeslicing": Isolation.NONE, "mig": Isolation.HARDWARE}
NOTES = {
    "mps": (
        "A slice is a share of a GPU through MPS: the DRA driver holds your server's CUDA memory to "
        "your slice, so code that asks for more gets an out-of-memory error."
    ),
    "timeslicing": (
        "A slice is a time-sliced share of a GPU: nothing holds its memory; gpuslice caps PyTorch, "
        "TensorFlow, JAX and CuPy in your kernels to your slice, but other CUDA code can use more."
    ),
    "mig": mig.NOTE,
}


@dataclass(frozen=True)
class Dra(SharingBackend):
    name = "dra"
    slice_note = NOTES["mps"]
    reads = (SLICES, CLAIMS)
    claims = True

    driver: str = "gpu.nvidia.com"
    device_class: str = "gpu.nvidia.com"  # the driver's chart: DeviceClass gpu.nvidia.com (type gpu)
    mig_device_class: str = "mig.nvidia.com"  # and mig.nvidia.com (type mig)
    slices: str = "mps"  # how a slice is held: mps, timeslicing or mig
    mig_tables: Mapping[str, tuple[mig.MigProfile, ...]] = field(default_factory=lambda: dict(mig.PROFILES))

    def __post_init__(self) -> None:
        if self.slices not in MODES:
            raise ValueError(f"dra slices must be one of {', '.join(MODES)}, not {self.slices!r}")

    # -- the pod ------------------------------------------------------------------------

    def render_whole(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        exactly = {"deviceClassName": self.device_class, "allocationMode": "ExactCount", "count": request.gpus}
        return ServerGpuSpec(
            annotations={ANNOTATION_BACKEND: self.name},
            env={ENV_ISOLATION: Isolation.HARDWARE.value},
            claim=claim_spec(exactly),
            isolation=Isolation.HARDWARE,
        )

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        if self.slices == "mig":
            return self._mig_slice(request, target)
        held = math.ceil(slice_bytes(request, target.card_bytes, self.name) / MiB) * MiB
        exactly: dict[str, Any] = {
            "deviceClassName": self.device_class,
            "capacity": {"requests": {"memory": f"{held // MiB}Mi"}},
        }
        if target.uuid:  # gpuslice's placement chose the card: the claim may take no other
            exactly["selectors"] = [{"cel": {"expression": self._attribute("uuid", target.uuid)}}]
        if self.slices == "mps":
            sharing = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": f"{held // MiB}Mi"}}
        else:
            sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
        isolation = MODES[self.slices]
        return ServerGpuSpec(
            annotations={ANNOTATION_MEMORY: str(held), ANNOTATION_BACKEND: self.name},
            env=slice_env(held, target.card_bytes, isolation),
            warnings=(NO_ISOLATION_WARNING,) if isolation is Isolation.NONE else (),
            claim=claim_spec(exactly, self._config(sharing)),
            isolation=isolation,
        )

    def _mig_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        profiles = mig.table(target.product, self.mig_tables) if target.product else mig.PROFILES[mig.DEFAULT_CARD]
        card_bytes = target.card_bytes or max(p.memory_mib for p in profiles) * MiB
        profile = mig.smallest_profile(slice_bytes(request, card_bytes, self.name), profiles)
        selectors = [{"cel": {"expression": self._attribute("profile", profile.name)}}]
        if target.uuid:
            selectors.append({"cel": {"expression": self._attribute("parentUUID", target.uuid)}})
        exactly = {"deviceClassName": self.mig_device_class, "selectors": selectors}
        held = profile.memory_mib * MiB
        return ServerGpuSpec(
            annotations={ANNOTATION_MEMORY: str(held), ANNOTATION_BACKEND: self.name},
            env=slice_env(held, held, Isolation.HARDWARE),
            claim=claim_spec(exactly),
            isolation=Isolation.HARDWARE,
        )

    def _attribute(self, name: str, value: str) -> str:
        """A CEL selector on one of the driver's string attributes (as its demo specs write them)."""
        if "'" in value or "\\" in value:
            raise ShareError(f"{value!r} cannot be written in a CEL selector")
        return f"device.attributes['{self.driver}'].{name} == '{value}'"

    def _config(self, sharing: Obj) -> list[Obj]:
        parameters = {"apiVersion": GPU_CONFIG_VERSION, "kind": "GpuConfig", "sharing": dict(sharing)}
        return [{"requests": [REQUEST], "opaque": {"driver": self.driver, "parameters": parameters}}]

    # -- the inventory ------------------------------------------------------------------

    def read_cluster(self, listing: Listing) -> Inventory:
        """Cards from the ResourceSlices of each node, allocations from the allocated claims."""
        inventory = Inventory([], self.name, slice_note=NOTES[self.slices])
        devices = published_devices(listing.objects.get(SLICES.key, ()), self.driver)
        wanted = "mig" if self.slices == "mig" else "gpu"
        by_device: dict[tuple[str, str], Gpu] = {}
        for obj in listing.nodes:
            node = node_of(obj)
            for device in (d for d in devices.get(node.name, []) if d.type == wanted):
                gpu = Gpu(
                    node.name,
                    len(node.gpus),
                    device.product,
                    device.memory_bytes,
                    uuid=device.uuid,
                    healthy=node.healthy,
                    mig_profile=device.profile or None,
                )
                node.gpus.append(gpu)
                by_device[(device.pool, device.name)] = gpu
            if self.slices != "mig" and any(not d.shareable for d in devices.get(node.name, []) if d.type == "gpu"):
                inventory.warnings.append(
                    f"node {node.name}: {self.driver} publishes its GPUs for one claim at a time (no "
                    "allowMultipleAllocations), so a slice there takes the whole card; set the dra backend's "
                    "slices to mig, or ask for whole cards"
                )
            inventory.nodes.append(node)
        pods = {(p["metadata"].get("namespace", ""), p["metadata"].get("name", "")): p for p in listing.pods}
        for pod in listing.pods:
            bound = next((n for n in inventory.nodes if n.name == pod.get("spec", {}).get("nodeName")), None)
            if bound is not None and holds_resources(pod):
                cpu, memory = pod_requests(pod)
                bound.cpu_used_milli += cpu
                bound.memory_used_bytes += memory
        for claim in listing.objects.get(CLAIMS.key, ()):
            owner = claim_owner(claim, pods)
            for result in allocated(claim, self.driver):
                card = by_device.get((result["pool"], result["device"]))
                if card is None:
                    inventory.warnings.append(
                        f"claim {claim['metadata'].get('namespace')}/{claim['metadata']['name']} holds "
                        f"{result['pool']}/{result['device']}, which no ResourceSlice publishes"
                    )
                    continue
                consumed = (result.get("consumedCapacity") or {}).get("memory")
                amount = parse_quantity(str(consumed)) if consumed else card.memory_bytes
                card.allocations.append(
                    Allocation(owner[0], owner[1], amount, owner[2] or claim["metadata"]["name"], not consumed)
                )
        return inventory


@dataclass(frozen=True)
class Published:
    """One device of a ResourceSlice, as the driver publishes it."""

    pool: str
    name: str
    type: str  # "gpu" or "mig"
    uuid: str
    product: str
    memory_bytes: int
    profile: str = ""
    shareable: bool = False  # allowMultipleAllocations: claims may consume parts of its capacity


def published_devices(slices: Any, driver: str) -> dict[str, list[Published]]:
    """Node name -> the driver's devices in its ResourceSlices (the newest generation of each pool)."""
    newest: dict[str, int] = {}
    for item in slices:
        spec = item.get("spec", {})
        if spec.get("driver") == driver:
            pool = spec.get("pool") or {}
            newest[pool.get("name", "")] = max(newest.get(pool.get("name", ""), 0), int(pool.get("generation", 0)))
    found: dict[str, list[Published]] = {}
    for item in slices:
        spec = item.get("spec", {})
        pool = spec.get("pool") or {}
        if spec.get("driver") != driver or int(pool.get("generation", 0)) < newest.get(pool.get("name", ""), 0):
            continue
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            memory = ((device.get("capacity") or {}).get("memory") or {}).get("value", "0")
            found.setdefault(str(spec.get("nodeName") or ""), []).append(
                Published(
                    pool=str(pool.get("name", "")),
                    name=str(device["name"]),
                    type=_string(attributes, "type"),
                    uuid=_string(attributes, "uuid"),
                    product=_string(attributes, "productName") or "unknown",
                    memory_bytes=parse_quantity(str(memory)),
                    profile=_string(attributes, "profile"),
                    shareable=bool(device.get("allowMultipleAllocations")),
                )
            )
    return found


def _string(attributes: Obj, name: str) -> str:
    """A device attribute's string value (published unqualified: the driver's domain is implied)."""
    value = attributes.get(name) or {}
    return str(value.get("string") or "")


def allocated(claim: Obj, driver: str) -> list[Obj]:
    """The driver's devices a claim holds (``status.allocation.devices.results``)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [r for r in results if r.get("driver") == driver]


def claim_owner(claim: Obj, pods: Mapping[tuple[str, str], Obj]) -> tuple[str, str, str]:
    """(user, server, pod) of the pod a claim is reserved for, else of the pod that owns it."""
    namespace = claim["metadata"].get("namespace", "")
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    names = [r.get("name", "") for r in reserved if r.get("resource") == "pods"]
    names += [o.get("name", "") for o in claim["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"]
    for name in names:
        pod = pods.get((namespace, name))
        if pod is not None:
            return pod_owner(pod)
    return "", "", names[0] if names else ""


def claim_spec(exactly: Obj, config: list[Obj] | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate's ``spec`` with one request named ``gpu``."""
    devices: dict[str, Any] = {"requests": [{"name": REQUEST, "exactly": dict(exactly)}]}
    if config:
        devices["config"] = config
    return {"spec": {"devices": devices}}
