"""hub/malloc.py: the extender's process keeps the memory it frees instead of faulting it in again.

What the placement decisions suffered (docs/placement.md, issue 38): arrays of a few hundred KB
to a few MB made and freed at every decision, which glibc handed back to the kernel, so every
decision faulted their pages in again. The check below is that pattern in a fresh process,
counted with ``getrusage``: with glibc's defaults, and after ``keep_freed_memory()``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hub import extender
from hub.malloc import keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]
GLIBC = platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")

# Four arrays of 1 MiB made and freed, 200 times over (after one cycle to warm up): the minor
# page faults of those 200 cycles.
CYCLES = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from hub.malloc import keep_freed_memory
    assert keep_freed_memory()
def cycle():
    arrays = [np.ones(2**20 // 8) for _ in range(4)]
    del arrays
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    # glibc's own defaults: no tunables or MALLOC_* variables from whoever runs the tests.
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", CYCLES, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return int(done.stdout)


@needs_glibc
@pytest.mark.process
def test_glibc_takes_both_thresholds() -> None:
    # In a process of its own: the test run's own malloc is left as it is.
    said = subprocess.run(
        [sys.executable, "-c", "from hub.malloc import keep_freed_memory; print(keep_freed_memory())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert said.stdout.strip() == "True"


def test_no_glibc_nothing_done(monkeypatch: pytest.MonkeyPatch) -> None:
    class Musl:  # a C library with no gnu_get_libc_version
        def mallopt(self, *args: Any) -> int:
            raise AssertionError("mallopt called where the C library is not glibc")

    monkeypatch.setattr("hub.malloc.ctypes.CDLL", lambda name: Musl())
    assert keep_freed_memory() is False


@needs_glibc
@pytest.mark.process
def test_freed_memory_is_not_faulted_in_again() -> None:
    default, kept = faults("default"), faults("keep")
    # glibc's defaults: the 4 MiB freed go back to the kernel, about 1,024 faults a cycle.
    assert default >= 200 * 256, (default, kept)
    # Kept: the same cycles fault (next to) nothing.
    assert kept * 20 < default, (default, kept)


def test_extender_server_keeps_freed_memory_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(extender, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(extender.web, "run_app", lambda *args, **kwargs: calls.append("serve"))
    extender.serve(object(), object(), "default", "127.0.0.1", 0)  # type: ignore[arg-type]
    assert calls == ["keep", "serve"]
