"""What a local notebook server is confined to, as data: its limits, its devices, its cgroup's files.

Pure: no I/O. The limits of a server come from the settings' ``limits``, its class's
(``limits.classes``) over them (``limits_for``); ``device_rules`` says which device nodes its
processes may open (the usual pseudo-devices, terminals, and the NVIDIA nodes of its own
cards, nothing of the other cards); ``v1_files``, ``v2_files`` and ``systemd_properties``
say the same to each of the three ways a machine can confine a process group: the cgroup
v1 filesystem (one hierarchy per controller), the cgroup v2 filesystem (one hierarchy), or
systemd (a transient scope unit). spawner/cgroupfs.py and spawner/systemd_units.py do the I/O.

The defaults suit a class sharing one machine (docs/security.md#limits-per-server says how
they were chosen): 4 GiB of memory for a JupyterLab server, its kernels and its tmpfs pages
(a server takes about 150 MB, a PyTorch kernel with a CUDA context 2 to 3 GiB of host
memory), 512 processes (a server with a few kernels and terminals runs 20 to 60; ``pip``
building with ``make -j`` a few dozen more; a fork bomb stops there), an equal CPU weight
(100, systemd's default: when the machine is busy every server gets the same share,
however many processes it runs), and 1 GiB each for the private ``/tmp`` and ``/dev/shm``
(PyTorch's DataLoader workers pass batches through ``/dev/shm``; Docker's 64 MiB default is
a known cause of their crashes). Both tmpfs count within the memory limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from difflib import get_close_matches
from typing import Any

from spawner.shares import ShareError, format_bytes, parse_quantity

GiB = 2**30


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 * GiB
    processes: int = 512
    cpu_weight: int = 100  # 1-10000, systemd's CPUWeight scale (100: an equal share)
    tmp_bytes: int = GiB
    shm_bytes: int = GiB
    home_bytes: int = 10 * GiB  # not a cgroup's: the HomeOverSize alert's line (docs/security.md)
    cpus: float | None = None  # a hard CPU quota in cores (a job's ``cpus``); None: the weight alone
    job_file_bytes: int = GiB  # not a cgroup's: the largest file a batch job writes, its output included (RLIMIT_FSIZE)
    # Not a cgroup's: CPU-only batch jobs one person may have starting, running or stopping at once (they wait
    # for no slice, so the GPU line does not bound them); the machine's, not a class's (hub/job_dispatch.py).
    cpu_jobs: int = 4

    def describe(self) -> str:
        return (
            f"memory {format_bytes(self.memory_bytes)}, {self.processes} processes, CPU weight {self.cpu_weight}, "
            f"/tmp {format_bytes(self.tmp_bytes)}, /dev/shm {format_bytes(self.shm_bytes)}, "
            f"home {format_bytes(self.home_bytes)} (alerted)"
        )


DEFAULT_LIMITS = Limits()
# Settings spelling -> field; sizes are quantities ("4GiB"), the others plain integers.
LIMIT_KEYS = {"memory": "memory_bytes", "processes": "processes", "cpu_weight": "cpu_weight", "tmp": "tmp_bytes"}
LIMIT_KEYS |= {"shm": "shm_bytes", "home": "home_bytes", "job_file": "job_file_bytes", "cpu_jobs": "cpu_jobs"}
_SIZES = {"memory", "tmp", "shm", "home", "job_file"}
_RANGES = {"processes": (16, 1_000_000), "cpu_weight": (1, 10_000), "cpu_jobs": (1, 1_000)}
_SMALLEST = {"memory": 256 * 2**20, "tmp": 2**20, "shm": 2**20, "home": 2**20, "job_file": 2**20}


class LimitsError(ValueError):
    """A limit in the settings is malformed; the message names it and says what to write."""


def parse_limits(
    raw: Mapping[str, Any], base: Limits = DEFAULT_LIMITS, where: str = "limits", others: tuple[str, ...] = ()
) -> Limits:
    """``base`` with the keys of ``raw`` (settings spelling: memory, processes, cpu_weight, tmp, shm, home, job_file,
    cpu_jobs) applied; ``others``: keys the caller reads itself, skipped here."""
    known = (*LIMIT_KEYS, *others)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        guesses = [f"{k} (did you mean {c[0]}?)" if (c := get_close_matches(k, known, 1)) else k for k in unknown]
        raise LimitsError(f"{where}: unknown key(s) {', '.join(guesses)}; use {', '.join(known)}")
    changes: dict[str, int] = {}
    for key, value in raw.items():
        if key in others:
            continue
        changes[LIMIT_KEYS[key]] = _size(key, value, where) if key in _SIZES else _count(key, value, where)
    return replace(base, **changes)


def parse_settings_limits(raw: Mapping[str, Any]) -> tuple[Limits, dict[str, Limits]]:
    """The settings' ``limits``: the machine's, and under ``classes`` each class's over them.

    ``{memory: 4GiB, classes: {ml101: {memory: 2GiB}}}`` gives every server 4 GiB but ml101's 2 GiB.
    """
    machine = parse_limits(raw, others=("classes",))
    classes = raw.get("classes") or {}
    if not isinstance(classes, Mapping):
        raise LimitsError("limits.classes must map class names to their limits (for example ml101: {memory: 2GiB})")
    own = {}
    for name, rules in classes.items():
        if not isinstance(rules, Mapping):
            raise LimitsError(f"limits.classes.{name} must be a mapping of limits (for example memory: 2GiB)")
        if "cpu_jobs" in rules:
            raise LimitsError(
                f"limits.classes.{name}.cpu_jobs: CPU-only jobs per person are the machine's limit, not a class's;"
                " set limits.cpu_jobs"
            )
        own[str(name)] = parse_limits(rules, machine, f"limits.classes.{name}")
    return machine, own


def limits_for(raw: Mapping[str, Any], classes: list[str]) -> Limits:
    """A server's limits from the settings' ``limits``: those of the first of ``classes`` that has
    its own (the class charged for the slice first), else the machine's."""
    machine, own = parse_settings_limits(raw)
    return next((own[c] for c in classes if c in own), machine)


def _size(key: str, value: Any, where: str) -> int:
    try:
        amount = parse_quantity(str(value))
    except ShareError as exc:
        raise LimitsError(f"{where}.{key}: {exc}") from None
    if amount >= 2**62:
        raise LimitsError(f"{where}.{key}: {value} is more memory than any machine has")
    if amount < _SMALLEST[key]:
        raise LimitsError(f"{where}.{key}: {value} is too small; at least {format_bytes(_SMALLEST[key])}")
    return int(amount)


def _count(key: str, value: Any, where: str) -> int:
    low, high = _RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LimitsError(f"{where}.{key}: must be a whole number from {low} to {high}, not {value!r}")
    return value


# -- devices ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceNode:
    """A character device node, e.g. /dev/nvidia1 (195, 1). ``card``: the GPU it is, if one."""

    path: str
    major: int
    minor: int
    card: int | None = None


# What every server may open, as Docker allows a container by default: null, zero, full,
# random, urandom, tty, ptmx and the pseudo-terminals (JupyterLab's terminals need them).
BASE_DEVICES: tuple[str, ...] = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm")
BASE_DEVICES += ("c 5:2 rwm", "c 136:* rwm")
_CARD = re.compile(r"^nvidia(\d+)$")


def nvidia_card(name: str) -> int | None:
    """The card a /dev node name stands for (``nvidia3`` -> 3); None for nvidiactl, nvidia-uvm, ..."""
    found = _CARD.match(name)
    return int(found.group(1)) if found else None


def device_rules(nodes: list[DeviceNode], cards: set[int]) -> list[str]:
    """The devices cgroup's allow list for a server holding ``cards``: a closed list, every other
    device refused. NVIDIA nodes that are no card (nvidiactl, nvidia-uvm) are allowed only with
    a card: a CPU-only server reaches no NVIDIA node at all."""
    allowed = list(BASE_DEVICES)
    for node in nodes:
        if node.card in cards or (node.card is None and cards):
            allowed.append(f"c {node.major}:{node.minor} rw")
    return allowed


# -- each way of confining ---------------------------------------------------------------


def cpu_shares(weight: int) -> int:
    """cgroup v1's cpu.shares for a systemd CPUWeight (100 -> 1024, the kernel's default share)."""
    return max(2, weight * 1024 // 100)


CPU_PERIOD_US = 100_000  # the kernel's default period; a quota of N cores is N periods of CPU time per period


def cpu_quota_us(cpus: float | None) -> int:
    """Microseconds of CPU time per ``CPU_PERIOD_US`` for ``cpus`` cores (at least 1 ms, the kernel's floor)."""
    return max(1000, round((cpus or 0) * CPU_PERIOD_US))


def v1_files(limits: Limits, devices: list[str]) -> dict[str, list[tuple[str, str]]]:
    """controller -> (file, value) to write, in order, in the server's cgroup of that controller.

    ``memory.limit_in_bytes`` charges a tmpfs page to the cgroup of the process that first
    touched it, so /tmp and /dev/shm count; ``devices.deny a`` first closes the list.
    """
    quota = [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", str(cpu_quota_us(limits.cpus)))]
    return {
        "memory": [("memory.limit_in_bytes", str(limits.memory_bytes))],
        "pids": [("pids.max", str(limits.processes))],
        "cpu": [("cpu.shares", str(cpu_shares(limits.cpu_weight))), *(quota if limits.cpus else [])],
        "devices": [("devices.deny", "a"), *(("devices.allow", rule) for rule in devices)],
    }


def v2_files(limits: Limits) -> list[tuple[str, str]]:
    """(file, value) in the server's cgroup v2 directory. cgroup v2 has no devices files (its
    device rules are eBPF programs, which systemd writes): without systemd they are not set."""
    return [
        ("memory.max", str(limits.memory_bytes)),
        ("memory.swap.max", "0"),  # a limit that swap could stretch is no limit on a shared machine
        ("pids.max", str(limits.processes)),
        ("cpu.weight", str(limits.cpu_weight)),
        *([("cpu.max", f"{cpu_quota_us(limits.cpus)} {CPU_PERIOD_US}")] if limits.cpus else []),
    ]


def systemd_properties(limits: Limits, nodes: list[DeviceNode], cards: set[int]) -> list[str]:
    """``systemd-run --property`` values for the server's scope (systemd.resource-control(5))."""
    allowed = [n.path for n in nodes if n.card in cards or (n.card is None and cards)]
    return [
        f"MemoryMax={limits.memory_bytes}",
        "MemorySwapMax=0",
        f"TasksMax={limits.processes}",
        f"CPUWeight={limits.cpu_weight}",
        *([f"CPUQuota={round(limits.cpus * 100)}%"] if limits.cpus else []),
        "DevicePolicy=closed",  # the standard pseudo-devices only, and what DeviceAllow adds
        "DeviceAllow=char-pts rw",
        "DeviceAllow=/dev/ptmx rw",
        *(f"DeviceAllow={path} rw" for path in allowed),
    ]


def cgroup_name(key: str, started: float) -> str:
    """A server's cgroup or unit name: ``gpuslice-<user>-<server>-<time>``, made of characters
    every cgroup filesystem and systemd accept, distinct for each start of the same server."""
    user, _, server = key.partition("/")
    named = "-".join(_escape(part) for part in (user, server) if part)
    return f"gpuslice-{named}-{int(started * 1000)}"


def _escape(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", lambda m: f"_{ord(m.group(0)):x}", part)
