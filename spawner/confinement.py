"""Each local notebook server in a cgroup of its own, by whichever means this machine has.

``for_machine`` chooses, as root: systemd's transient scopes where systemd is PID 1
(spawner/systemd_units.py), else the cgroup filesystem, v1 or v2 (spawner/cgroupfs.py);
not as root, or with neither, nothing (the caller says so in its log, once). Either way the
server's command becomes: [systemd-run --scope ...] unshare --mount python confined_start.py
[--cgroup DIR...] ... -- SERVER (spawner/confined_start.py joins the cgroup, mounts the private
/tmp and /dev/shm, binds the models and becomes the user).

A platform's cgroups and scopes carry its id (from its data folder): two platforms on one
machine (a test run beside a real one) never take each other's servers for orphans.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spawner import cgroupfs, systemd_units
from spawner.cgroups import DeviceNode, Limits, cgroup_name, device_rules, nvidia_card, systemd_properties

CONFINE = Path(__file__).with_name("confined_start.py")


def platform_id(data_dir: Path) -> str:
    """A short id for the platform whose data folder is ``data_dir`` (stable across restarts)."""
    return hashlib.sha256(str(data_dir.absolute()).encode()).hexdigest()[:8]


def nvidia_nodes(device_dir: Path = Path("/dev")) -> list[DeviceNode]:
    """The NVIDIA character devices in ``device_dir`` (a test's folder of mknod nodes, or /dev)."""
    nodes = []
    for path in sorted(device_dir.glob("nvidia*")):
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_char_device():
            rdev = stat.st_rdev
            nodes.append(DeviceNode(str(path), os.major(rdev), os.minor(rdev), nvidia_card(path.name)))
    return nodes


@dataclass(frozen=True)
class Server:
    """What confining one server takes: its cgroup's name, its limits, its cards, its user."""

    name: str
    limits: Limits
    cards: set[int]
    user: str = ""  # become this account (unix-users); empty: stay the platform's account
    keep: list[str] = field(default_factory=list)  # paths under /tmp the server needs
    models: dict[str, str] = field(default_factory=dict)  # mount point -> read-only source


class Confinement(Protocol):
    kind: str
    enforces_devices: bool

    def command(self, server: Server, nodes: list[DeviceNode], inner: list[str]) -> list[str]: ...
    def names(self) -> set[str]: ...
    def pids(self, name: str) -> set[int]: ...
    def remove(self, name: str) -> set[int]: ...


def confine_command(server: Server, cgroups: list[Path], inner: list[str]) -> list[str]:
    """unshare's new mount namespace, then confined_start.py's steps, then ``inner`` (pure)."""
    args = [arg for folder in cgroups for arg in ("--cgroup", str(folder))]
    args += ["--tmp", str(server.limits.tmp_bytes), "--shm", str(server.limits.shm_bytes)]
    args += [arg for path in server.keep for arg in ("--keep", path)]
    args += [arg for target, source in server.models.items() for arg in ("--model", f"{target}={source}")]
    args += ["--user", server.user] if server.user else []
    unshare = shutil.which("unshare") or "unshare"
    # By path, not "-m spawner.confined_start": it needs the standard library only.
    return [unshare, "--mount", "--propagation", "private", "--", sys.executable, str(CONFINE), *args, "--", *inner]


class CgroupFiles:
    """The cgroup filesystem (v1 or v2), under ``gpuslice/<platform id>``."""

    def __init__(self, hierarchy: cgroupfs.Hierarchy, platform: str) -> None:
        self.cgroups = cgroupfs.Cgroups(hierarchy, f"{cgroupfs.PARENT}/{platform}")
        self.kind = f"cgroup v{hierarchy.version}"
        self.enforces_devices = hierarchy.enforces_devices

    def command(self, server: Server, nodes: list[DeviceNode], inner: list[str]) -> list[str]:
        folders = self.cgroups.create(server.name, server.limits, device_rules(nodes, server.cards))
        return confine_command(server, folders, inner)

    def names(self) -> set[str]:
        return self.cgroups.names()

    def pids(self, name: str) -> set[int]:
        return self.cgroups.pids(name)

    def remove(self, name: str) -> set[int]:
        return self.cgroups.remove(name)


class SystemdScopes:
    """systemd's transient scopes, named ``gpuslice-<platform id>-...``."""

    kind = "systemd"
    enforces_devices = True

    def __init__(self, platform: str, mount: Path = Path("/sys/fs/cgroup")) -> None:
        self.prefix = f"gpuslice-{platform}-"
        self.mount = mount

    def command(self, server: Server, nodes: list[DeviceNode], inner: list[str]) -> list[str]:
        properties = systemd_properties(server.limits, nodes, server.cards)
        return systemd_units.scope_command(server.name, properties, confine_command(server, [], inner))

    def names(self) -> set[str]:
        return {u for u in systemd_units.units() if u.startswith(self.prefix)}

    def pids(self, name: str) -> set[int]:
        found: set[int] = set()
        for procs in self.mount.glob(f"**/{systemd_units.SLICE}/{name}.scope/cgroup.procs"):
            found |= {int(p) for p in procs.read_text().split()}
        return found

    def remove(self, name: str) -> set[int]:
        left = self.pids(name)
        systemd_units.stop(name)
        return left


def for_machine(data_dir: Path) -> Confinement | None:
    """This machine's way of confining servers, for the platform of ``data_dir`` (None: none, or not root)."""
    platform = platform_id(data_dir)
    hierarchy = cgroupfs.detect()
    if hierarchy is None:
        return None  # not root, or no cgroup filesystem to use
    if systemd_units.booted():
        return SystemdScopes(platform)
    return CgroupFiles(hierarchy, platform)


def unit_name(platform: str, key: str, started: float) -> str:
    """The server's cgroup or scope name (spawner/cgroups.py ``cgroup_name``, with the platform's id)."""
    return cgroup_name(key, started).replace("gpuslice-", f"gpuslice-{platform}-", 1)
