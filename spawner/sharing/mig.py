"""MIG (NVIDIA's device plugin with the mixed strategy): a slice is a MIG instance of the card.

A pod asks for ``nvidia.com/mig-<profile>: 1``, the smallest profile of the chosen card that
holds the request; a node offers each profile as a resource of its own, counted per instance.
The hardware gives an instance its own memory and compute.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from spawner.inventory import Gpu, Node
from spawner.shares import GpuRequest, MiB, ShareError, format_bytes
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
    node_allocatable,
    node_model,
    pod_resources,
    slice_bytes,
    slice_env,
)

PREFIX = "nvidia.com/mig-"
NOTE = (
    "A slice is a MIG instance of the card: the hardware gives it its own memory and compute, so no "
    "one else's code can take them."
)


@dataclass(frozen=True)
class MigProfile:
    """One MIG instance shape; ``memory_mib`` is what the instance really offers."""

    name: str  # "1g.10gb"
    memory_mib: int
    compute_slices: int


# One table per card, keyed by family and memory. A100, A30 and H100-80GB: the memory each
# instance really has, as `nvidia-smi mig -lgip` reports it (less than the name says).
# H100-94GB (H100 NVL) and H200-141GB: the profile names of NVIDIA's MIG user guide
# ("Supported MIG Profiles"), the memory taken from the name in decimal GB, rounded down
# to MiB, which never promises a kernel more than the instance has. Clusters with other
# cards pass their own tables.
PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": (
        MigProfile("1g.5gb", 4864, 1),
        MigProfile("2g.10gb", 9984, 2),
        MigProfile("3g.20gb", 19968, 3),
        MigProfile("4g.20gb", 19968, 4),
        MigProfile("7g.40gb", 40192, 7),
    ),
    "A100-80GB": (
        MigProfile("1g.10gb", 9728, 1),
        MigProfile("1g.20gb", 19968, 1),
        MigProfile("2g.20gb", 19968, 2),
        MigProfile("3g.40gb", 40192, 3),
        MigProfile("4g.40gb", 40192, 4),
        MigProfile("7g.80gb", 80896, 7),
    ),
    "H100-80GB": (
        MigProfile("1g.10gb", 9984, 1),
        MigProfile("1g.20gb", 19968, 1),
        MigProfile("2g.20gb", 19968, 2),
        MigProfile("3g.40gb", 40448, 3),
        MigProfile("4g.40gb", 40448, 4),
        MigProfile("7g.80gb", 80896, 7),
    ),
    "H100-94GB": (
        MigProfile("1g.12gb", 11444, 1),
        MigProfile("1g.24gb", 22888, 1),
        MigProfile("2g.24gb", 22888, 2),
        MigProfile("3g.47gb", 44822, 3),
        MigProfile("4g.47gb", 44822, 4),
        MigProfile("7g.94gb", 89645, 7),
    ),
    "H200-141GB": (
        MigProfile("1g.18gb", 17166, 1),
        MigProfile("1g.35gb", 33378, 1),
        MigProfile("2g.35gb", 33378, 2),
        MigProfile("3g.71gb", 67710, 3),
        MigProfile("4g.71gb", 67710, 4),
        MigProfile("7g.141gb", 134468, 7),
    ),
    "A30-24GB": (
        MigProfile("1g.6gb", 5836, 1),
        MigProfile("2g.12gb", 11672, 2),
        MigProfile("4g.24gb", 23344, 4),
    ),
}
# A product label without a memory size names the card's only size (H100 NVL: 94 GB).
_DEFAULT_GB = {"A30": 24, "H200": 141, "H100-NVL": 94, "H100": 80}
# The card whose profiles a request is rendered with when the chosen card's product is not known.
DEFAULT_CARD = "A100-40GB"


class MigProductError(ShareError):
    """A GPU product label with no MIG profile table; the message names the label."""


def card(product: str, tables: Mapping[str, tuple[MigProfile, ...]] = PROFILES) -> str:
    """The key in ``tables`` for a node's ``nvidia.com/gpu.product`` label.

    GPU feature discovery writes labels such as ``NVIDIA-A100-SXM4-80GB``,
    ``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-H100-NVL``, ``NVIDIA-A30`` (with ``-MIG-1g.10gb``
    appended under the single MIG strategy): the family and the memory size are read from
    its words, so the form factor (SXM4, PCIe) does not matter.
    """
    words = re.split(r"[-_ ]+", product.upper().split("-MIG-")[0])
    family = next((w for w in words if w in {"A100", "A30", "H100", "H200"}), "")
    sizes = [int(m.group(1)) for w in words if (m := re.fullmatch(r"(\d+)GB", w))]
    nvl = _DEFAULT_GB.get(f"{family}-NVL") if "NVL" in words else None
    size = sizes[0] if sizes else nvl or _DEFAULT_GB.get(family)
    key = f"{family}-{size}GB"
    if not family or size is None or key not in tables:
        raise MigProductError(
            f"the GPU product label nvidia.com/gpu.product={product!r} names no card with a MIG profile table "
            f"(known: {', '.join(sorted(tables))}); label the node with its product or give the spawner a table "
            "for it"
        )
    return key


def table(product: str, tables: Mapping[str, tuple[MigProfile, ...]] = PROFILES) -> tuple[MigProfile, ...]:
    """The MIG profiles of the card a product label names; MigProductError for an unknown one."""
    return tables[card(product, tables)]


def profile_bytes(name: str, profiles: tuple[MigProfile, ...]) -> int:
    """Memory of a MIG instance from its card's profile table (0: a profile the card does not have)."""
    return next((p.memory_mib * MiB for p in profiles if p.name == name), 0)


def smallest_profile(asked: int, profiles: tuple[MigProfile, ...]) -> MigProfile:
    """The smallest MIG instance that holds ``asked`` bytes (fewest compute slices on ties)."""
    fitting = [p for p in profiles if p.memory_mib * MiB >= asked]
    if not fitting:
        largest = max(profiles, key=lambda p: p.memory_mib)
        raise ShareError(
            f"{format_bytes(asked)} is more than the largest MIG instance here "
            f"({largest.name}, {format_bytes(largest.memory_mib * MiB)}); ask for "
            f"{format_bytes(largest.memory_mib * MiB)} or less, or for a whole card with gpus=1."
        )
    return min(fitting, key=lambda p: (p.memory_mib, p.compute_slices))


@dataclass(frozen=True)
class Mig(SharingBackend):
    name = "mig"
    slice_note = NOTE

    tables: Mapping[str, tuple[MigProfile, ...]] = field(default_factory=lambda: dict(PROFILES))

    def profiles(self, product: str) -> tuple[MigProfile, ...]:
        """The chosen card's own profiles (the default card's where the product is not known)."""
        return table(product, self.tables) if product else self.tables.get(DEFAULT_CARD, ())

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        profiles = self.profiles(target.product)
        if not profiles:
            raise ShareError("No MIG profiles are configured for this cluster; ask for a whole card with gpus=1.")
        card_bytes = target.card_bytes or max(p.memory_mib for p in profiles) * MiB
        profile = smallest_profile(slice_bytes(request, card_bytes, self.name), profiles)
        instance_bytes = profile.memory_mib * MiB
        return ServerGpuSpec(
            limits={f"{PREFIX}{profile.name}": "1"},
            annotations={ANNOTATION_MEMORY: str(instance_bytes), ANNOTATION_BACKEND: self.name},
            # The kernel sees only its instance, so the whole instance is its slice.
            env=slice_env(instance_bytes, instance_bytes, Isolation.HARDWARE),
            isolation=Isolation.HARDWARE,
        )

    def node_gpus(self, obj: Obj, node: str, listing: Listing, warnings: list[str]) -> list[Gpu]:
        """One card per MIG instance the node offers, sized from its product's profile table."""
        resources = sorted((r, c) for r, c in node_allocatable(obj).items() if r.startswith(PREFIX))
        if not resources:
            return []
        model = node_model(obj)
        try:
            profiles = table(model, self.tables)
        except MigProductError as exc:
            warnings.append(f"node {node}: {exc}; its MIG instances are left out")
            return []
        gpus: list[Gpu] = []
        for resource, count in resources:
            profile = resource[len(PREFIX) :]
            size = profile_bytes(profile, profiles)
            if not size:
                warnings.append(f"node {node}: {model} has no MIG profile {profile!r}; those instances are left out")
                continue
            for _ in range(int(count)):
                gpus.append(Gpu(node, len(gpus), model, size, mig_profile=profile))
        return gpus

    def attach(self, pod: Obj, node: Node, warnings: list[str]) -> None:
        """Each instance the pod asks for takes a free instance of that profile (whole cards are not offered)."""
        for resource in pod_resources(pod):
            if resource.startswith(PREFIX):
                profile = resource[len(PREFIX) :]
                for gpu in node.gpus:
                    if gpu.mig_profile == profile and not gpu.allocations:
                        gpu.allocations.append(allocation(pod, gpu.memory_bytes, True))
                        break
