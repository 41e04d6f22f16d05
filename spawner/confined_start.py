"""Start a notebook server confined: in its cgroup, with a private /tmp and /dev/shm, as its user.

Run as root, by path (it needs nothing but the standard library), inside a new mount
namespace made by ``unshare --mount --propagation private`` (spawner/local.py builds the
command; under systemd, inside the server's scope made by ``systemd-run --scope``):

    python confined_start.py [--cgroup DIR]... [--tmp BYTES] [--shm BYTES] [--keep PATH]...
                      [--model DIR=SOURCE]... [--user NAME] -- COMMAND...

1. joins each cgroup directory given (its processes, and all they start, are held to the
   server's limits; the process keeps its pid, so the hub's pid is the server's);
2. mounts a tmpfs of the given size on /tmp and on /dev/shm, seen by this server alone
   (their pages count in the server's memory limit). Paths under /tmp that the server needs
   (its home folder where the data folder is under /tmp) are bound back in (``--keep``);
3. binds each model folder read-only at DIR (spawner/mounts.py);
4. becomes the user (group, supplementary groups, user) and runs COMMAND in place.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Plan:
    cgroups: list[str] = field(default_factory=list)
    tmp_bytes: int = 0
    shm_bytes: int = 0
    keep: list[str] = field(default_factory=list)
    models: list[tuple[str, str]] = field(default_factory=list)
    user: str = ""
    command: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Plan:
    if "--" not in argv:
        raise SystemExit("usage: confined_start.py [--cgroup DIR]... [--tmp N] [--shm N] [--user U] -- COMMAND")
    split = argv.index("--")
    options, plan = argv[:split], Plan(command=argv[split + 1 :])
    pairs = list(zip(options[::2], options[1::2], strict=True))
    for flag, value in pairs:
        if flag == "--cgroup":
            plan.cgroups.append(value)
        elif flag == "--tmp":
            plan.tmp_bytes = int(value)
        elif flag == "--shm":
            plan.shm_bytes = int(value)
        elif flag == "--keep":
            plan.keep.append(value)
        elif flag == "--model":
            target, source = value.split("=", 1)
            plan.models.append((target, source))
        elif flag == "--user":
            plan.user = value
        else:
            raise SystemExit(f"confined_start.py: unknown option {flag}")
    if not plan.command:
        raise SystemExit("confined_start.py: no command to run after --")
    return plan


def join_cgroups(directories: list[str]) -> None:
    for directory in directories:
        Path(directory, "cgroup.procs").write_text(str(os.getpid()))


def private_tmpfs(target: str, size: int, keep: list[str]) -> None:
    """A fresh tmpfs of ``size`` bytes on ``target``; the paths of ``keep`` under it bound back in."""
    kept = [Path(k) for k in keep if Path(k).is_relative_to(target) and Path(k) != Path(target)]
    old = os.open(target, os.O_PATH | os.O_DIRECTORY)  # the old tree stays reachable through this
    try:
        _mount("-t", "tmpfs", "-o", f"size={size},mode=1777,nosuid,nodev", "tmpfs", target)
        for path in kept:
            relative = path.relative_to(target)
            (Path(target) / relative).mkdir(parents=True, exist_ok=True)
            # --no-canonicalize: the path through the old tree is meant; resolved by name it would be the new one.
            # --rbind: with the mounts under it (the models bound read-only into the home come along, still read-only)
            _mount("--no-canonicalize", "--rbind", f"/proc/{os.getpid()}/fd/{old}/{relative}", str(path))
    finally:
        os.close(old)


def bind_read_only(source: str, target: str) -> None:
    _mount("--bind", source, target)
    _mount("-o", "remount,bind,ro", target)


def become(user: str) -> None:
    """Drop root for ``user``: its group, its supplementary groups, then the user itself."""
    account = pwd.getpwnam(user)
    os.setgid(account.pw_gid)
    os.setgroups(os.getgrouplist(user, account.pw_gid))
    os.setuid(account.pw_uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit(f"confined_start.py: still root after becoming {user}")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main(argv: list[str]) -> None:
    plan = parse(argv)
    join_cgroups(plan.cgroups)
    # The models first: their sources may be under /tmp (a data folder there), which the private /tmp hides.
    for target, source in plan.models:
        bind_read_only(source, target)
    if plan.tmp_bytes:
        private_tmpfs("/tmp", plan.tmp_bytes, plan.keep)
    if plan.shm_bytes:
        private_tmpfs("/dev/shm", plan.shm_bytes, [])
    if plan.user:
        become(plan.user)
    run(plan.command)


def run(command: list[str]) -> None:
    """Become ``command``; one that cannot be run exits as a shell's would (127: not found, 126: not runnable),
    which a job's runner reads as "could not start"."""
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"confined_start.py: {command[0]}: command not found", file=sys.stderr)
        os._exit(127)
    except PermissionError:
        print(f"confined_start.py: {command[0]}: not executable", file=sys.stderr)
        os._exit(126)


if __name__ == "__main__":
    main(sys.argv[1:])
