"""Turn a GPU request into what a notebook server needs on each sharing backend.

Pure code: given a request and what is known about the card, return the container's
resource limits, the pod's annotations and the container's environment. The
KubeSpawner subclass copies these into the pod; the local spawner uses the env.

Every server that gets a GPU carries the slice in its environment so that the
kernel-side limits hook can cap PyTorch, TensorFlow, JAX and CuPy where the sharing
stack does not cap memory itself. CPU-only servers are hidden from every GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from spawner import environ
from spawner.shares import GiB, GpuRequest, MiB, RequestKind, ShareError, format_bytes

# The environment the kernel-side hook reads (spawner/kernel_hook/gpuslice_limits.py).
ENV_BYTES = environ.GPU_MEMORY_BYTES.name
ENV_FRACTION = environ.GPU_MEMORY_FRACTION.name
ENV_ISOLATION = environ.ISOLATION.name
# Our own record of the slice on the pod: the inventory reads it back on backends
# whose device plugin does not annotate the pod (time-slicing).
ANNOTATION_MEMORY = "gpuslice.io/gpu-memory-bytes"
ANNOTATION_BACKEND = "gpuslice.io/sharing-backend"

GPUSHARE_RESOURCE = "aliyun.com/gpu-mem"
# gpushare's device plugin counts aliyun.com/gpu-mem in its --memory-unit (GiB by default).
GPUSHARE_UNITS = {"GiB": GiB, "MiB": MiB}
HAMI_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
NVIDIA_GPU = "nvidia.com/gpu"
TIMESLICING_RESOURCE = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"


class Backend(StrEnum):
    GPUSHARE = "gpushare"
    HAMI = "hami"
    TIMESLICING = "timeslicing"
    MIG = "mig"
    WHOLE = "whole"
    LOCAL = "local"


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


# How a *slice* (not a whole card) is held to its memory on each backend: what the spawn
# form tells the person choosing one.
SLICE_ISOLATION: dict[Backend, Isolation] = {
    Backend.GPUSHARE: Isolation.NONE,  # gpushare's device plugin only counts GiB; nothing enforces them
    Backend.HAMI: Isolation.SOFTWARE,  # HAMi-core's CUDA layer in the container refuses allocations past the limit
    Backend.TIMESLICING: Isolation.NONE,
    Backend.MIG: Isolation.HARDWARE,  # a slice is a MIG instance
    Backend.WHOLE: Isolation.HARDWARE,  # no slices: whole cards only
    Backend.LOCAL: Isolation.NONE,
}

SLICE_NOTES: dict[Isolation, str] = {
    Isolation.NONE: (
        "A slice is shared without memory isolation: gpuslice caps PyTorch, TensorFlow, JAX and CuPy "
        "in your kernels to your slice, but other CUDA code can use more."
    ),
    Isolation.SOFTWARE: (
        "A slice is enforced by HAMi in your server: any CUDA code that asks for more memory than your "
        "slice gets an out-of-memory error instead."
    ),
    Isolation.HARDWARE: (
        "A slice is a MIG instance of the card: the hardware gives it its own memory and compute, so no "
        "one else's code can take them."
    ),
}


def slice_note(backend: Backend) -> str:
    """What the spawn form says of slices on ``backend`` ("" where none are offered)."""
    return "" if backend is Backend.WHOLE else SLICE_NOTES[SLICE_ISOLATION[backend]]


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
MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
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
_MIG_DEFAULT_GB = {"A30": 24, "H200": 141, "H100-NVL": 94, "H100": 80}


class MigProductError(ShareError):
    """A GPU product label with no MIG profile table; the message names the label."""


def mig_card(product: str, tables: Mapping[str, tuple[MigProfile, ...]] = MIG_PROFILES) -> str:
    """The key in ``tables`` for a node's ``nvidia.com/gpu.product`` label.

    GPU feature discovery writes labels such as ``NVIDIA-A100-SXM4-80GB``,
    ``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-H100-NVL``, ``NVIDIA-A30`` (with ``-MIG-1g.10gb``
    appended under the single MIG strategy): the family and the memory size are read from
    its words, so the form factor (SXM4, PCIe) does not matter.
    """
    words = re.split(r"[-_ ]+", product.upper().split("-MIG-")[0])
    family = next((w for w in words if w in {"A100", "A30", "H100", "H200"}), "")
    sizes = [int(m.group(1)) for w in words if (m := re.fullmatch(r"(\d+)GB", w))]
    nvl = _MIG_DEFAULT_GB.get(f"{family}-NVL") if "NVL" in words else None
    size = sizes[0] if sizes else nvl or _MIG_DEFAULT_GB.get(family)
    key = f"{family}-{size}GB"
    if not family or size is None or key not in tables:
        raise MigProductError(
            f"the GPU product label nvidia.com/gpu.product={product!r} names no card with a MIG profile table "
            f"(known: {', '.join(sorted(tables))}); label the node with its product or give the spawner a table "
            "for it"
        )
    return key


def mig_table(product: str, tables: Mapping[str, tuple[MigProfile, ...]] = MIG_PROFILES) -> tuple[MigProfile, ...]:
    """The MIG profiles of the card a product label names; MigProductError for an unknown one."""
    return tables[mig_card(product, tables)]


@dataclass(frozen=True)
class ServerGpuSpec:
    """What a server needs from its backend. Builders return fresh dicts."""

    limits: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    isolation: Isolation = Isolation.HARDWARE


def render(
    request: GpuRequest,
    backend: Backend,
    *,
    card_bytes: int | None = None,
    devices: tuple[str, ...] = (),
    mig_profiles: tuple[MigProfile, ...] = MIG_PROFILES["A100-40GB"],
    hami_cores_percent: int | None = None,
    timeslicing_resource: str = TIMESLICING_RESOURCE,
    gpushare_memory_unit: str = "GiB",
) -> ServerGpuSpec:
    """The limits, annotations, env and warnings for ``request`` on ``backend``.

    ``card_bytes`` is the memory of the card the slice goes to, when known (always on
    the local backend, which also needs ``devices``: the CUDA ids of the chosen cards).
    Raises ShareError for a request the backend cannot express.
    """
    if request.kind is RequestKind.CPU:
        return _cpu_only()
    builders: dict[Backend, Callable[[GpuRequest, int | None], ServerGpuSpec]] = {
        Backend.GPUSHARE: lambda r, c: _gpushare(r, c, gpushare_memory_unit),
        Backend.HAMI: lambda r, c: _hami(r, c, hami_cores_percent),
        Backend.TIMESLICING: lambda r, c: _timeslicing(r, c, timeslicing_resource),
        Backend.MIG: lambda r, c: _mig(r, c, mig_profiles),
        Backend.WHOLE: _whole,
        Backend.LOCAL: lambda r, c: _local(r, c, devices),
    }
    return builders[backend](request, card_bytes)


def _cpu_only() -> ServerGpuSpec:
    # Both: the NVIDIA container runtime reads the first, CUDA itself the second.
    return ServerGpuSpec(env={"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""})


def slice_env(slice_bytes: int, card_bytes: int | None, isolation: Isolation) -> dict[str, str]:
    """The env the kernel-side hook reads; the fraction only when the card is known."""
    env = {ENV_BYTES: str(slice_bytes), ENV_ISOLATION: isolation.value}
    if card_bytes:
        fraction = min(1.0, slice_bytes / card_bytes)
        env[ENV_FRACTION] = f"{fraction:.6f}"
        # JAX reads this itself at start; TensorFlow is capped by the hook.
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.6f}"
    return env


def _slice_bytes(request: GpuRequest, card_bytes: int | None, backend: Backend) -> int:
    if request.memory_bytes is not None:
        return request.memory_bytes
    if card_bytes is None:
        raise _needs_card(request, backend)
    return request.bytes_on(card_bytes)


def _needs_card(request: GpuRequest, backend: Backend) -> ShareError:
    return ShareError(
        f"A share of a card ({request.fraction:g}) needs the card's size on the {backend.value} backend; "
        'ask for memory instead, for example "4GiB".'
    )


def gpushare_unit_bytes(memory_unit: str) -> int:
    """Bytes in one aliyun.com/gpu-mem unit for gpushare's device plugin ``--memory-unit``."""
    if memory_unit not in GPUSHARE_UNITS:
        raise ValueError(
            f"gpushare memory unit must be one of {', '.join(GPUSHARE_UNITS)} (the device plugin's "
            f"--memory-unit), not {memory_unit!r}"
        )
    return GPUSHARE_UNITS[memory_unit]


def gpushare_card_units(card_bytes: int, memory_unit: str = "GiB") -> int:
    """gpushare's unit count for a card: its MiB, floored to whole GiB with GiB (a 16 GB card is 15)."""
    return (card_bytes // MiB) // (gpushare_unit_bytes(memory_unit) // MiB)


def _gpushare(request: GpuRequest, card_bytes: int | None, memory_unit: str) -> ServerGpuSpec:
    if request.kind is RequestKind.WHOLE:
        return _whole(request, card_bytes)
    unit = gpushare_unit_bytes(memory_unit)
    if request.memory_bytes is not None:
        # Round up: the slice must hold what was asked for.
        units = max(1, math.ceil(request.memory_bytes / unit))
    else:
        assert request.fraction is not None
        if card_bytes is None:
            raise _needs_card(request, Backend.GPUSHARE)
        # Round down: four quarters must fit on the card as gpushare counts it.
        units = max(1, math.floor(request.fraction * gpushare_card_units(card_bytes, memory_unit)))
    slice_bytes = units * unit
    return ServerGpuSpec(
        limits={GPUSHARE_RESOURCE: str(units)},
        annotations={ANNOTATION_MEMORY: str(slice_bytes), ANNOTATION_BACKEND: Backend.GPUSHARE.value},
        env=slice_env(slice_bytes, card_bytes, Isolation.NONE),
        warnings=(NO_ISOLATION_WARNING,),
        isolation=Isolation.NONE,
    )


def _hami(request: GpuRequest, card_bytes: int | None, cores_percent: int | None) -> ServerGpuSpec:
    if request.kind is RequestKind.WHOLE:
        return _whole(request, card_bytes)
    limits = {HAMI_GPU: "1"}
    if request.memory_bytes is not None:
        mib = max(1, math.ceil(request.memory_bytes / MiB))
        limits[HAMI_MEMORY] = str(mib)
        slice_bytes = mib * MiB
    else:
        assert request.fraction is not None
        # HAMi resolves a percentage against whichever card it picks.
        limits[HAMI_MEMORY_PERCENT] = str(max(1, math.floor(request.fraction * 100)))
        slice_bytes = request.bytes_on(card_bytes) if card_bytes else 0
    if cores_percent is not None:
        if not 1 <= cores_percent <= 100:
            raise ShareError(f"hami cores must be a percentage from 1 to 100, not {cores_percent}.")
        limits[HAMI_CORES] = str(cores_percent)
    env = (
        slice_env(slice_bytes, card_bytes, Isolation.SOFTWARE)
        if slice_bytes
        else {ENV_ISOLATION: Isolation.SOFTWARE.value}
    )
    annotations = {ANNOTATION_BACKEND: Backend.HAMI.value}
    if slice_bytes:
        annotations[ANNOTATION_MEMORY] = str(slice_bytes)
    return ServerGpuSpec(limits=limits, annotations=annotations, env=env, isolation=Isolation.SOFTWARE)


def _timeslicing(request: GpuRequest, card_bytes: int | None, resource: str) -> ServerGpuSpec:
    if request.kind is RequestKind.WHOLE:
        return _whole(request, card_bytes)
    slice_bytes = _slice_bytes(request, card_bytes, Backend.TIMESLICING)
    return ServerGpuSpec(
        limits={resource: "1"},
        annotations={ANNOTATION_MEMORY: str(slice_bytes), ANNOTATION_BACKEND: Backend.TIMESLICING.value},
        env=slice_env(slice_bytes, card_bytes, Isolation.NONE),
        warnings=(NO_ISOLATION_WARNING,),
        isolation=Isolation.NONE,
    )


def smallest_mig_profile(slice_bytes: int, profiles: tuple[MigProfile, ...]) -> MigProfile:
    """The smallest MIG instance that holds ``slice_bytes`` (fewest compute slices on ties)."""
    fitting = [p for p in profiles if p.memory_mib * MiB >= slice_bytes]
    if not fitting:
        largest = max(profiles, key=lambda p: p.memory_mib)
        raise ShareError(
            f"{format_bytes(slice_bytes)} is more than the largest MIG instance here "
            f"({largest.name}, {format_bytes(largest.memory_mib * MiB)}); ask for "
            f"{format_bytes(largest.memory_mib * MiB)} or less, or for a whole card with gpus=1."
        )
    return min(fitting, key=lambda p: (p.memory_mib, p.compute_slices))


def _mig(request: GpuRequest, card_bytes: int | None, profiles: tuple[MigProfile, ...]) -> ServerGpuSpec:
    if request.kind is RequestKind.WHOLE:
        return _whole(request, card_bytes)
    if not profiles:
        raise ShareError("No MIG profiles are configured for this cluster; ask for a whole card with gpus=1.")
    if card_bytes is None:
        card_bytes = max(p.memory_mib for p in profiles) * MiB
    profile = smallest_mig_profile(_slice_bytes(request, card_bytes, Backend.MIG), profiles)
    instance_bytes = profile.memory_mib * MiB
    return ServerGpuSpec(
        limits={f"{MIG_PREFIX}{profile.name}": "1"},
        annotations={ANNOTATION_MEMORY: str(instance_bytes), ANNOTATION_BACKEND: Backend.MIG.value},
        # The kernel sees only its instance, so the whole instance is its slice.
        env=slice_env(instance_bytes, instance_bytes, Isolation.HARDWARE),
        isolation=Isolation.HARDWARE,
    )


def _whole(request: GpuRequest, card_bytes: int | None) -> ServerGpuSpec:
    if request.kind is RequestKind.SLICE:
        raise ShareError(
            'This cluster gives out whole GPUs only; ask for gpus=1 (and gpu_memory "0") '
            "or ask your admin to enable a sharing backend."
        )
    return ServerGpuSpec(
        limits={NVIDIA_GPU: str(request.gpus)},
        annotations={ANNOTATION_BACKEND: Backend.WHOLE.value},
        env={ENV_ISOLATION: Isolation.HARDWARE.value},
        isolation=Isolation.HARDWARE,
    )


def _local(request: GpuRequest, card_bytes: int | None, devices: tuple[str, ...]) -> ServerGpuSpec:
    wanted = request.gpus if request.kind is RequestKind.WHOLE else 1
    if len(devices) != wanted:
        raise ValueError(f"local backend needs {wanted} device id(s) from placement, got {devices!r}")
    env = {"CUDA_VISIBLE_DEVICES": ",".join(devices), "NVIDIA_VISIBLE_DEVICES": ",".join(devices)}
    if request.kind is RequestKind.WHOLE:
        env[ENV_ISOLATION] = Isolation.HARDWARE.value
        return ServerGpuSpec(env=env, isolation=Isolation.HARDWARE)
    slice_bytes = _slice_bytes(request, card_bytes, Backend.LOCAL)
    env.update(slice_env(slice_bytes, card_bytes, Isolation.NONE))
    return ServerGpuSpec(env=env, warnings=(NO_ISOLATION_WARNING,), isolation=Isolation.NONE)
