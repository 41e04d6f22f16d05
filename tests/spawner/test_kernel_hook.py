"""The kernel-side limits hook, in a real interpreter started as a notebook's would be."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spawner.assets import HOOK_DIR

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

FAKES = Path(__file__).parent / "fake_frameworks"
GiB = 2**30

SCRIPT = """
import json, os, sys
import gpuslice_limits
import torch, tensorflow, cupy

torch.cuda.init()
print(json.dumps({
    "torch": torch.calls, "tensorflow": tensorflow.calls, "cupy": cupy.calls,
    "jax_env": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
    "applied": gpuslice_limits.applied,
}))
"""


def run(env_extra: dict[str, str], script: str = SCRIPT) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), str(FAKES)])
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def test_every_framework_is_held_to_the_slice() -> None:
    result = run({"GPUSLICE_GPU_MEMORY_BYTES": str(4 * GiB), "GPUSLICE_GPU_MEMORY_FRACTION": "0.250000"})
    assert result["torch"] == [["set_per_process_memory_fraction", 0.25, 0]]
    assert result["tensorflow"] == [["/physical_device:GPU:0", [4096]]]
    assert result["cupy"] == [["set_limit", 4 * GiB]]
    assert result["jax_env"] == "0.250000"


def test_torch_fraction_comes_from_bytes_and_the_card_when_the_card_was_unknown() -> None:
    result = run({"GPUSLICE_GPU_MEMORY_BYTES": str(2 * GiB)})
    assert result["torch"] == [["set_per_process_memory_fraction", 0.125, 0]]  # 2 of the fake's 16 GiB
    assert result["jax_env"] is None  # JAX needs the fraction before it sees the card


def test_torch_is_capped_when_cuda_starts_not_at_import() -> None:
    script = (
        "import torch, gpuslice_limits, json; before = list(torch.calls); torch.cuda.init(); "
        "print(json.dumps({'before': before, 'after': torch.calls}))"
    )
    result = run({"GPUSLICE_GPU_MEMORY_BYTES": str(4 * GiB)}, script)
    assert result == {"before": [], "after": [["set_per_process_memory_fraction", 0.25, 0]]}


def test_without_a_slice_nothing_is_touched() -> None:
    result = run({})
    assert result["torch"] == [] and result["tensorflow"] == [] and result["cupy"] == []
    assert result["applied"] == {}


def test_a_broken_framework_api_does_not_break_the_import() -> None:
    script = (
        "import sys, types, json; m = types.ModuleType('cupy'); sys.modules['cupy'] = m; "
        "import gpuslice_limits; gpuslice_limits.install(); print(json.dumps(gpuslice_limits.applied))"
    )
    applied = run({"GPUSLICE_GPU_MEMORY_BYTES": str(GiB)}, script)
    assert str(applied["cupy"]).startswith("not applied: AttributeError")
