"""One machine (``gpuslice up``): gpuslice itself places slices and keeps them in its ledger.

The server is pinned to its cards with ``CUDA_VISIBLE_DEVICES``; nothing below the kernels
enforces a slice, so the framework hook caps them. The inventory is the machine's GPUs and
the ledger's rows (spawner/inventory.py ``build_local``), never Kubernetes objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from spawner.shares import GpuRequest, RequestKind
from spawner.sharing.base import (
    ENV_ISOLATION,
    NO_ISOLATION_WARNING,
    Isolation,
    ServerGpuSpec,
    SharingBackend,
    Target,
    slice_bytes,
    slice_env,
)


@dataclass(frozen=True)
class Local(SharingBackend):
    name = "local"
    kubernetes = False

    def render_whole(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        env = {**self._pinned(request, target), ENV_ISOLATION: Isolation.HARDWARE.value}
        return ServerGpuSpec(env=env, isolation=Isolation.HARDWARE)

    def render_slice(self, request: GpuRequest, target: Target) -> ServerGpuSpec:
        env = self._pinned(request, target)
        env.update(slice_env(slice_bytes(request, target.card_bytes, self.name), target.card_bytes, Isolation.NONE))
        return ServerGpuSpec(env=env, warnings=(NO_ISOLATION_WARNING,), isolation=Isolation.NONE)

    @staticmethod
    def _pinned(request: GpuRequest, target: Target) -> dict[str, str]:
        wanted = request.gpus if request.kind is RequestKind.WHOLE else 1
        if len(target.devices) != wanted:
            raise ValueError(f"local backend needs {wanted} device id(s) from placement, got {target.devices!r}")
        devices = ",".join(target.devices)
        return {"CUDA_VISIBLE_DEVICES": devices, "NVIDIA_VISIBLE_DEVICES": devices}
