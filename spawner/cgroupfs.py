"""The cgroup filesystem: each notebook server's own cgroup, made with its limits, emptied and removed.

For machines where systemd is not PID 1 (spawner/systemd_units.py is for the others). Both
layouts exist in the wild: cgroup v1 mounts one hierarchy per controller
(``/sys/fs/cgroup/memory``, ``pids``, ``cpu``, ``devices``), cgroup v2 one hierarchy for
all. ``Hierarchy`` says which this machine has, read from ``/proc/self/mounts``; a test
gives ``Cgroups`` a temporary tree instead. The values written come from spawner/cgroups.py.

Every server's cgroup sits under one parent (``gpuslice``), so the servers left by a hub
that is gone are found by listing it, whether or not anything recorded them. The parent keeps
the kernel's default CPU weight, as the servers' ``gpuslice.slice`` does beside ``system.slice``
under systemd: all servers together weigh as one process beside the hub, the proxy and the
portal, which keep answering while a class starts (weights only divide a busy CPU: an idle hub
leaves the servers every core; a class of 60 started 60 of 60 so, docs/load.md). Parents that
weighed the sum of their servers were tried: a hub beside 20 starting servers then took over
90 s to start, and one restarted beside them so long that servers waiting for it gave up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from spawner.cgroups import Limits, v1_files, v2_files

PARENT = "gpuslice"
V1_CONTROLLERS = ("memory", "pids", "cpu", "devices")
V2_CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True)
class Hierarchy:
    """Where the controllers are: v1, one folder per controller; v2, the one folder (under "")."""

    version: int
    mounts: dict[str, Path]

    @property
    def enforces_devices(self) -> bool:
        return self.version == 1  # cgroup v2's device rules are eBPF programs: systemd's job


def hierarchy_from_mounts(mounts: str, v2_controllers: set[str] | None = None) -> Hierarchy | None:
    """The hierarchy to use from the text of /proc/self/mounts (pure): cgroup v1 when every
    controller needed is mounted there, else cgroup v2 when it has them (``v2_controllers``:
    the contents of its cgroup.controllers), else None."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        _, mountpoint, kind, options = parts[:4]
        if kind == "cgroup":
            for controller in set(options.split(",")) & set(V1_CONTROLLERS):
                v1[controller] = Path(mountpoint)
        elif kind == "cgroup2":
            v2 = Path(mountpoint)
    if set(v1) == set(V1_CONTROLLERS):
        return Hierarchy(1, v1)
    if v2 is not None and set(V2_CONTROLLERS) <= (v2_controllers or set()):
        return Hierarchy(2, {"": v2})
    return None


def detect() -> Hierarchy | None:
    """This machine's hierarchy (None: no usable cgroup filesystem, or not root)."""
    if os.geteuid() != 0:
        return None
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    v2 = next((line.split()[1] for line in mounts.splitlines() if " cgroup2 " in line), None)
    controllers: set[str] = set()
    if v2 is not None:
        with contextlib.suppress(OSError):
            controllers = set(Path(v2, "cgroup.controllers").read_text().split())
    return hierarchy_from_mounts(mounts, controllers)


class Cgroups:
    """The servers' cgroups under ``PARENT`` in ``hierarchy``."""

    def __init__(self, hierarchy: Hierarchy, parent: str = PARENT) -> None:
        self.hierarchy = hierarchy
        self.parent = parent

    def directories(self, name: str) -> list[Path]:
        """The server's cgroup folder in each hierarchy (what its process joins)."""
        return [mount / self.parent / name for mount in self.hierarchy.mounts.values()]

    def create(self, name: str, limits: Limits, devices: list[str]) -> list[Path]:
        """Make the server's cgroup with its limits (before its process starts); return its folders."""
        if self.hierarchy.version == 1:
            files = v1_files(limits, devices)
            for controller, mount in self.hierarchy.mounts.items():
                folder = mount / self.parent / name
                folder.mkdir(parents=True, exist_ok=True)
                for file, value in files[controller]:
                    (folder / file).write_text(value)
        else:
            mount = self.hierarchy.mounts[""]
            enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
            for folder in (mount, mount / self.parent):  # each level hands the controllers down
                folder.mkdir(exist_ok=True)
                (folder / "cgroup.subtree_control").write_text(enable)
            folder = mount / self.parent / name
            folder.mkdir(exist_ok=True)
            for file, value in v2_files(limits):
                (folder / file).write_text(value)
        return self.directories(name)

    def names(self) -> set[str]:
        """Every server cgroup present (in any hierarchy)."""
        found: set[str] = set()
        for mount in self.hierarchy.mounts.values():
            with contextlib.suppress(OSError):
                found |= {p.name for p in (mount / self.parent).iterdir() if p.is_dir()}
        return found

    def pids(self, name: str) -> set[int]:
        """The processes in the server's cgroup, in any hierarchy."""
        found: set[int] = set()
        for folder in self.directories(name):
            with contextlib.suppress(OSError):
                found |= {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
        return found

    def remove(self, name: str, timeout_s: float = 10.0) -> set[int]:
        """Kill whatever still runs in the server's cgroup and remove it; return the pids killed.

        SIGKILL in rounds until the cgroup is empty: a process may fork while the list is read,
        and its limit on processes bounds how often.
        """
        killed: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while (left := self.pids(name)) and time.monotonic() < deadline:
            for pid in left - {os.getpid()}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed |= left
            time.sleep(0.05)
        for folder in self.directories(name):
            _rmdir(folder)
            _rmdir(folder.parent, quietly=True)  # the platform's folder, once its last server is gone
        return killed


def _rmdir(folder: Path, quietly: bool = False) -> None:
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        # busy: a process is still exiting (the next start removes it); not empty: other servers
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or (not quietly and exc.errno != errno.EBUSY):
            raise
