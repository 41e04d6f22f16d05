"""The folders the platform puts on every notebook server's paths: the kernel hook (on the
kernel's PYTHONPATH) and the JupyterLab files (on JUPYTER_PATH). Apart from the spawner so that
the commands that only copy or point at them (`gpuslice up`'s user environment, the job
dispatcher) do not import the spawner."""

from __future__ import annotations

from pathlib import Path

HOOK_DIR = Path(__file__).parent / "kernel_hook"
LAB_DIR = Path(__file__).parent / "lab"  # on JUPYTER_PATH: labextensions/@gpuslice/reclaim-notice
