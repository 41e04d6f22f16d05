"""spawner/confined_start.py: a server's own /tmp and /dev/shm, bounded and private; its user (as root)."""

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from spawner import confined_start
from spawner.cgroups import Limits
from spawner.confinement import Server, confine_command

MiB = 2**20


def test_its_arguments() -> None:
    plan = confined_start.parse(["--cgroup", "/a", "--tmp", "5", "--keep", "/tmp/h", "--user", "ann", "--", "x", "-y"])
    assert (plan.cgroups, plan.tmp_bytes, plan.keep, plan.user, plan.command) == (
        ["/a"],
        5,
        ["/tmp/h"],
        "ann",
        ["x", "-y"],
    )
    with pytest.raises(SystemExit, match="unknown option --colour"):
        confined_start.parse(["--colour", "red", "--", "x"])
    with pytest.raises(SystemExit, match="usage"):
        confined_start.parse(["x"])


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts a tmpfs in a new mount namespace: run as root (CI does)"
)

PROBE = """
import errno, os, shutil, sys
name = sys.argv[1]
open(f"/tmp/{name}", "w").write(name)
print(sorted(f for f in os.listdir("/tmp") if f.startswith("mine-")))
print(shutil.disk_usage("/tmp").total // 2**20, shutil.disk_usage("/dev/shm").total // 2**20)
try:
    open("/dev/shm/big", "wb").write(b"x" * 40 * 2**20)
    print("wrote 40 MiB")
except OSError as exc:
    print(errno.errorcode[exc.errno])
print(os.getuid() != 0)
"""


def _server(name: str, user: str = "", confined: bool = True) -> list[str]:
    command = ["/usr/bin/python3", "-c", PROBE, name]  # one every account may run (not a venv under /root)
    if not confined:
        return command
    return confine_command(Server(name, Limits(tmp_bytes=16 * MiB, shm_bytes=32 * MiB), set(), user=user), [], command)


@needs_root
@pytest.mark.process
def test_tmp_and_dev_shm_are_the_servers_own_and_bounded(tmp_path: Path) -> None:
    first = subprocess.run(_server("mine-ann"), capture_output=True, text=True, check=True).stdout
    second = subprocess.run(_server("mine-bob", "nobody"), capture_output=True, text=True, check=True).stdout
    assert first.splitlines() == ["['mine-ann']", "16 32", "ENOSPC", "False"]
    assert second.splitlines() == ["['mine-bob']", "16 32", "ENOSPC", "True"]  # not ann's file; not root
    assert not Path("/tmp/mine-ann").exists()  # nothing reached the machine's /tmp
    # The control: a server started plainly shares the machine's /tmp (and its file stays there).
    try:
        plain = subprocess.run(_server("mine-carl", confined=False), capture_output=True, text=True, check=True)
        assert "'mine-carl'" in plain.stdout.splitlines()[0] and Path("/tmp/mine-carl").exists()
        assert plain.stdout.splitlines()[2] == "wrote 40 MiB"
    finally:
        Path("/tmp/mine-carl").unlink(missing_ok=True)
        Path("/dev/shm/big").unlink(missing_ok=True)
    assert pwd.getpwnam("nobody").pw_uid != 0
