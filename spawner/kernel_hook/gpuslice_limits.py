"""Hold a notebook's GPU frameworks to its slice. Dependency-free; runs at interpreter start.

The notebook server's environment carries the slice (``GPUSLICE_GPU_MEMORY_BYTES``,
and ``GPUSLICE_GPU_MEMORY_FRACTION`` when the card is known). ``install()`` caps each
framework as soon as it is imported, whatever the import order:

* PyTorch: ``torch.cuda.set_per_process_memory_fraction`` on every visible device,
  queued until CUDA initialises so that importing torch stays cheap.
* TensorFlow: a logical device with ``memory_limit`` on each visible GPU.
* JAX: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (set before JAX reads it).
* CuPy: the default memory pool's limit.

It does nothing without the slice variables or without the frameworks, and never
raises: a kernel must start even if a framework's API moved.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

ENV_BYTES = "GPUSLICE_GPU_MEMORY_BYTES"
ENV_FRACTION = "GPUSLICE_GPU_MEMORY_FRACTION"
MiB = 1024 * 1024
applied: dict[str, str] = {}  # framework -> what was done (or why not), for users and tests


def slice_bytes() -> int | None:
    try:
        value = int(os.environ.get(ENV_BYTES, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def slice_fraction(total_bytes: int | None = None) -> float | None:
    try:
        fraction = float(os.environ.get(ENV_FRACTION, ""))
    except ValueError:
        fraction = 0.0
    if 0 < fraction <= 1:
        return fraction
    amount = slice_bytes()
    if amount and total_bytes:
        return min(1.0, amount / total_bytes)
    return None


def _limit_torch(torch: Any) -> None:
    def apply() -> None:
        for device in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(device).total_memory
            fraction = slice_fraction(total)
            if fraction is not None:
                torch.cuda.set_per_process_memory_fraction(fraction, device)
                applied["torch"] = f"memory fraction {fraction:.4f} on {torch.cuda.device_count()} device(s)"

    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None and not torch.cuda.is_initialized():
        lazy_call(apply)
        applied["torch"] = "queued until CUDA initialises"
    else:
        apply()


def _limit_tensorflow(tf: Any) -> None:
    amount = slice_bytes()
    if amount is None:
        return
    limit_mib = max(1, amount // MiB)
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)])
    applied["tensorflow"] = f"memory_limit {limit_mib} MiB"


def _limit_cupy(cupy: Any) -> None:
    amount = slice_bytes()
    if amount is None:
        return
    cupy.get_default_memory_pool().set_limit(size=amount)
    applied["cupy"] = f"pool limit {amount} bytes"


def _limit_jax_env() -> None:
    fraction = slice_fraction()
    if fraction is not None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{fraction:.6f}")
        applied["jax"] = f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']}"


LIMITERS: dict[str, Callable[[Any], None]] = {
    "torch": _limit_torch,
    "tensorflow": _limit_tensorflow,
    "cupy": _limit_cupy,
}


def _apply(name: str, module: Any) -> None:
    try:
        LIMITERS[name](module)
    except Exception as exc:  # never break the user's import
        applied[name] = f"not applied: {exc!r}"


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched framework so the cap runs right after its import."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LIMITERS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _apply(self.name, module)


def install() -> None:
    """Cap what is imported already; watch for what is imported later."""
    if slice_bytes() is None and slice_fraction() is None:
        return
    _limit_jax_env()
    for name in LIMITERS:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
