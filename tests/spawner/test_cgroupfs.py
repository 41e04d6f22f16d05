"""spawner.cgroupfs and spawner.confinement: servers' cgroups, on a temporary tree and, as root, for real.

The real ones run a stand-in server through the same command a notebook server gets
(unshare, confined_start.py, the cgroup) and show each limit holding, beside the same
attack run without it succeeding.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawner.cgroupfs import Cgroups, Hierarchy, detect, hierarchy_from_mounts
from spawner.cgroups import Limits
from spawner.confinement import CgroupFiles, Server, nvidia_nodes, unit_name
from tests.e2e.platform import process_alive

MiB = 2**20
V1_MOUNTS = """\
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_the_hierarchy_is_read_from_the_mounts() -> None:
    v1 = hierarchy_from_mounts(V1_MOUNTS, set())
    assert v1 == Hierarchy(
        1,
        {
            "memory": Path("/sys/fs/cgroup/memory"),
            "pids": Path("/sys/fs/cgroup/pids"),
            "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
            "devices": Path("/sys/fs/cgroup/devices"),
        },
    )
    assert v1.enforces_devices
    v2 = hierarchy_from_mounts(V2_MOUNTS, {"cpuset", "cpu", "io", "memory", "pids"})
    assert v2 == Hierarchy(2, {"": Path("/sys/fs/cgroup")}) and not v2.enforces_devices
    assert hierarchy_from_mounts(V2_MOUNTS, {"cpu"}) is None  # memory and pids not delegated
    assert hierarchy_from_mounts("proc /proc proc rw 0 0\n", set()) is None


def test_a_v1_cgroup_is_made_with_its_files(tmp_path: Path) -> None:
    mounts = {c: tmp_path / c for c in ("memory", "pids", "cpu", "devices")}
    cgroups = Cgroups(Hierarchy(1, mounts), "gpuslice/p1")
    folders = cgroups.create("gpuslice-p1-ann-1", Limits(512 * MiB, 64, 50, MiB, MiB), ["c 1:3 rwm"])
    assert folders == [tmp_path / c / "gpuslice/p1/gpuslice-p1-ann-1" for c in mounts]
    assert (folders[0] / "memory.limit_in_bytes").read_text() == str(512 * MiB)
    assert (folders[1] / "pids.max").read_text() == "64"
    assert (folders[2] / "cpu.shares").read_text() == "512"
    assert (folders[3] / "devices.allow").read_text() == "c 1:3 rwm"  # a file here; the kernel's list for real
    assert cgroups.names() == {"gpuslice-p1-ann-1"}
    (folders[1] / "cgroup.procs").write_text("12\n34\n")
    assert cgroups.pids("gpuslice-p1-ann-1") == {12, 34}


def test_a_v2_cgroup_hands_the_controllers_down(tmp_path: Path) -> None:
    cgroups = Cgroups(Hierarchy(2, {"": tmp_path}), "gpuslice/p1")
    (tmp_path / "gpuslice").mkdir()
    [folder] = cgroups.create("s", Limits(512 * MiB, 64, 50, MiB, MiB), [])
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (tmp_path / "gpuslice/p1/cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert {f.name: f.read_text() for f in folder.iterdir()} == {
        "memory.max": str(512 * MiB),
        "memory.swap.max": "0",
        "pids.max": "64",
        "cpu.weight": "50",
    }


# -- for real, as root ---------------------------------------------------------------------


@pytest.fixture
def confinement() -> Iterator[CgroupFiles]:
    hierarchy = detect()
    if hierarchy is None or hierarchy.version != 1:
        pytest.skip("needs root and the cgroup v1 controllers memory, pids, cpu, devices (as CI runs)")
    made = CgroupFiles(hierarchy, f"test-{os.getpid()}")
    yield made
    for name in made.names():
        made.remove(name)
    assert not any((mount / made.cgroups.parent).exists() for mount in hierarchy.mounts.values())


def _run(
    confinement: CgroupFiles | None, code: str, limits: Limits, cards: set[int] | None = None, devices: str = ""
) -> str:
    """Run ``code`` as a server is run (confined; or plainly, the control); its output and exit status.
    ``devices``: a folder of device nodes under /tmp, kept visible in the server's own /tmp."""
    command = [sys.executable, "-c", code]
    if confinement is not None:
        keep = [devices] if devices else []
        server = Server(unit_name("t", "ann/", time.time()), limits, cards or set(), keep=keep)
        command = confinement.command(server, nvidia_nodes(Path(devices or "/dev")), command)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return f"{done.stdout}exit {done.returncode}"


ALLOCATE = "b = bytearray(600 * 2**20); print('allocated')"


@pytest.mark.process
def test_a_process_past_its_memory_limit_is_killed(confinement: CgroupFiles) -> None:
    assert _run(confinement, ALLOCATE, Limits(memory_bytes=300 * MiB)) == "exit -9"  # the OOM killer
    assert _run(None, ALLOCATE, Limits()) == "allocated\nexit 0"  # the control: nothing stops it


FORK_BOMB = """
import os, time
children = []
try:
    while len(children) < 300:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print("stopped", exc.errno == 11)
print(len(children) < 64)
for pid in children:
    os.kill(pid, 9)
"""


@pytest.mark.process
def test_a_fork_bomb_stops_at_the_process_limit(confinement: CgroupFiles) -> None:
    assert _run(confinement, FORK_BOMB, Limits(processes=64)) == "stopped True\nTrue\nexit 0"
    assert _run(None, FORK_BOMB, Limits()) == "False\nexit 0"  # the control: 300 processes


OPEN_CARDS = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print("opened")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""


@pytest.mark.process
def test_a_server_opens_its_own_card_and_not_another(confinement: CgroupFiles, tmp_path: Path) -> None:
    """Nodes made with mknod as NVIDIA's (major 195): with no driver, opening one the cgroup allows
    fails with ENXIO (no such device), one it refuses with EPERM."""
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(tmp_path / name, 0o666 | 0o020000, os.makedev(195, minor))
    paths = [str(tmp_path / n) for n in ("nvidia0", "nvidia1", "nvidiactl")] + ["/dev/null"]
    code = OPEN_CARDS.replace("sys.argv[1:]", repr(paths))
    assert _run(confinement, code, Limits(), {0}, str(tmp_path)) == "ENXIO\nEPERM\nENXIO\nopened\nexit 0"
    assert _run(confinement, code, Limits(), set(), str(tmp_path)) == "EPERM\nEPERM\nEPERM\nopened\nexit 0"
    assert _run(None, code, Limits()) == "ENXIO\nENXIO\nENXIO\nopened\nexit 0"  # the control: every card


@pytest.mark.process
def test_what_a_server_leaves_in_its_cgroup_is_ended_with_it(confinement: CgroupFiles) -> None:
    server = Server(unit_name("t", "ann/", time.time()), Limits(), set())
    kernel = "import time; time.sleep(300)"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {kernel!r}], start_new_session=True)"
    subprocess.run(confinement.command(server, [], [sys.executable, "-c", code]), check=True, timeout=60)
    left = confinement.pids(server.name)
    assert len(left) == 1  # the "kernel", in a session of its own, orphaned when its server ended
    assert confinement.remove(server.name) == left
    assert server.name not in confinement.names()
    assert not any(process_alive(pid) for pid in left)
    # The platform's own folder went with its last server.
    assert not any((m / confinement.cgroups.parent).exists() for m in confinement.cgroups.hierarchy.mounts.values())
