"""Checks that need a real NVIDIA GPU; run by hand on a GPU machine (CI has none).

    python -m tests.gpu.check_real_gpu

It prints what it saw and exits non-zero on the first check that fails:

1. ``spawner.gpus.detect`` finds the cards through NVML (not the simulated fallback).
2. ``nvml_samples`` reads every card, and the exporter's scrape carries the DCGM-named
   series with ``gpuslice_gpu_simulated 0``.
3. The kernel hook holds PyTorch, CuPy and JAX to a slice: a notebook process given a
   4 GiB slice can allocate 3 GiB but not 5 GiB (PyTorch, CuPy), and JAX's preallocation
   follows the slice's fraction of the card.
4. While that process holds GPU memory, the exporter attributes it to the notebook's
   user and server (``gpuslice_process_gpu_memory_bytes``), read from NVML's process list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import generate_latest

from hub.exporter import GpuCollector, registry_for
from spawner.gpus import detect, nvml_samples

GiB = 2**30
HOOK = Path(__file__).resolve().parents[2] / "spawner" / "kernel_hook"

# Runs as a notebook kernel would: the hook is on PYTHONPATH and the slice in the environment.
_TORCH = """
import json, sys, torch
x = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
try:
    y = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    over = "allowed"
except torch.cuda.OutOfMemoryError as exc:
    over = "refused: " + str(exc).splitlines()[0][:160]
import gpuslice_limits
print(json.dumps({"3GiB": "allowed", "3GiB+2GiB": over, "applied": gpuslice_limits.applied}), flush=True)
sys.stdin.readline()  # hold the 3 GiB until the parent has scraped
"""
_CUPY = """
import json, cupy
x = cupy.empty(3 * 2**30, dtype=cupy.uint8)
try:
    y = cupy.empty(2 * 2**30, dtype=cupy.uint8)
    over = "allowed"
except cupy.cuda.memory.OutOfMemoryError as exc:
    over = "refused: " + str(exc)[:160]
import gpuslice_limits
print(json.dumps({"3GiB": "allowed", "3GiB+2GiB": over, "applied": gpuslice_limits.applied}))
"""
_JAX = """
import json, jax, jax.numpy as jnp
x = jnp.zeros((1024,), dtype=jnp.float32).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
import gpuslice_limits
print(json.dumps({"bytes_limit": stats.get("bytes_limit"), "applied": gpuslice_limits.applied}))
"""


def kernel_env(slice_bytes: int, card_bytes: int) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=f"{HOOK}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        GPUSLICE_GPU_MEMORY_BYTES=str(slice_bytes),
        GPUSLICE_GPU_MEMORY_FRACTION=f"{slice_bytes / card_bytes:.6f}",
        JUPYTERHUB_USER="ann",
        JUPYTERHUB_SERVER_NAME="",
        CUDA_VISIBLE_DEVICES="0",
    )


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        raise SystemExit(1)


def main() -> None:
    import pynvml

    gpus, found = detect("1x16GiB")
    print("detect:", found, [(g.index, g.model, g.memory_bytes, g.uuid, g.simulated) for g in gpus])
    check(found == "NVML" and bool(gpus) and not any(g.simulated for g in gpus), "NVML finds real cards")
    card = gpus[0].memory_bytes

    samples = nvml_samples(pynvml)
    for s in samples:
        print("sample:", s)
    check(len(samples) == len(gpus) and samples[0].memory_total_bytes == card, "NVML samples every card")
    scrape = generate_latest(registry_for(GpuCollector(lambda: nvml_samples(pynvml), "nvml", "gpu-box"))).decode()
    check('gpuslice_exporter_source_up{source="nvml"} 1.0' in scrape, "the exporter's NVML source answers")
    check("gpuslice_gpu_simulated{" in scrape and "} 0.0" in scrape, "cards are not labelled simulated")
    check("DCGM_FI_DEV_FB_USED{" in scrape and "DCGM_FI_DEV_POWER_USAGE{" in scrape, "DCGM-named series")

    env = kernel_env(4 * GiB, card)
    torch_kernel = subprocess.Popen(
        [sys.executable, "-c", _TORCH], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert torch_kernel.stdout is not None and torch_kernel.stdin is not None
    seen = json.loads(torch_kernel.stdout.readline())
    print("torch:", seen)
    check(seen["3GiB+2GiB"].startswith("refused"), "PyTorch in a 4 GiB slice: 3 GiB allowed, 5 GiB refused")
    deadline = time.monotonic() + 20
    attributed = ""
    while time.monotonic() < deadline and not attributed:
        scrape = generate_latest(registry_for(GpuCollector(lambda: nvml_samples(pynvml), "nvml", "gpu-box"))).decode()
        attributed = next(
            (
                line
                for line in scrape.splitlines()
                if line.startswith("gpuslice_process_gpu_memory_bytes{") and f'pid="{torch_kernel.pid}"' in line
            ),
            "",
        )
        time.sleep(0.5)
    print("process series:", attributed or "(none)")
    check('user="ann"' in attributed and float(attributed.rsplit(" ", 1)[1]) >= 3 * GiB, "memory attributed to ann")
    torch_kernel.stdin.write("\n")
    torch_kernel.stdin.flush()
    torch_kernel.wait(timeout=60)

    cupy = subprocess.run([sys.executable, "-c", _CUPY], env=env, capture_output=True, text=True, timeout=300)
    print("cupy:", cupy.stdout.strip() or cupy.stderr[-1000:])
    check(cupy.returncode == 0 and "refused" in cupy.stdout, "CuPy in a 4 GiB slice: 5 GiB refused")

    jax = subprocess.run([sys.executable, "-c", _JAX], env=env, capture_output=True, text=True, timeout=300)
    print("jax:", jax.stdout.strip() or jax.stderr[-1000:])
    limit = json.loads(jax.stdout)["bytes_limit"] if jax.returncode == 0 else None
    check(limit is not None and limit <= 4 * GiB * 1.01, f"JAX's memory limit follows the slice ({limit} bytes)")


if __name__ == "__main__":
    main()
