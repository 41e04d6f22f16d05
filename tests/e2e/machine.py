"""A Debian machine with systemd as PID 1, as a podman container, for the tests of `gpuslice install`.

The image is images/machine (systemd, Node.js, Debian's Prometheus and Alertmanager) on the
Debian base the other images share, built once per machine by tests/kube/images.py (its tag is a
hash of its inputs). The container is given this checkout and its Python environment read-only
at the same paths (what scripts/setup leaves on an admin's machine), a folder to exchange files
with the test, and loopback only (``--network none``: nothing it runs meets the host's ports).

systemd boots in it here with podman's ``--systemd=always`` plus two flags, each needed
(checked on this sandbox, cgroups v1 with cgroup2 beside them): ``--cgroupns=private``, without
which systemd takes the host's cgroup paths for its own and creates the scopes' memory cgroups
where none can be (a scope's MemoryMax is accepted and never applied), and ``--privileged``,
without which podman mounts the v1 controllers read-only (the same result).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.kube import images

REPO = Path(__file__).resolve().parents[2]
EXCHANGE = "/srv/exchange"  # the test's folder, in the machine


SYSTEM = (Path("/usr"), Path("/usr/local"))  # the machine's own: its python3 is the same Debian's


def code_paths() -> list[Path]:
    """The checkout, its environment and the interpreter it was made from (unless the system's), each once."""
    paths = {REPO, Path(sys.prefix).resolve(), (REPO / "node_modules").resolve()}
    if Path(sys.base_prefix).resolve() not in SYSTEM:
        paths.add(Path(sys.base_prefix).resolve())  # a python built apart (pyenv): its libraries are the image's
    return sorted(p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths))


class Machine:
    """One container booted by systemd; ``run`` a command in it, ``reboot`` it, ``remove`` it."""

    def __init__(self, image: str, exchange: Path) -> None:
        self.image, self.exchange = image, exchange
        self.name = f"gpuslice-machine-{uuid.uuid4().hex[:8]}"

    def start(self, boot_s: float = 180) -> None:
        mounts = [arg for path in code_paths() for arg in ("--volume", f"{path}:{path}:ro")]
        images.podman(
            "run",
            "--detach",
            "--name",
            self.name,
            "--hostname",
            "gpuslice-machine",
            "--systemd=always",
            "--cgroupns=private",
            "--privileged",
            "--network=none",
            *mounts,
            "--volume",
            f"{self.exchange}:{EXCHANGE}",
            self.image,
        )
        self.wait_booted(boot_s)

    def wait_booted(self, timeout_s: float) -> None:
        """Until systemd says the boot is over (running, or degraded: one unit failed, said by the test)."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{self.name} did not boot in {timeout_s} s (systemd says {state!r})")

    def run(
        self, *command: str, check: bool = True, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        given = [arg for key, value in (env or {}).items() for arg in ("--env", f"{key}={value}")]
        done = images.podman("exec", *given, self.name, *command, timeout=timeout, check=False)
        if check and done.returncode != 0:
            said = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            raise AssertionError(f"{' '.join(command)} failed ({done.returncode}) in {self.name}:\n{said}")
        return done

    def python(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """This checkout's code with its interpreter (before install puts the gpuslice command in place)."""
        return self.run(sys.executable, *args, check=check, timeout=timeout, env={"PYTHONPATH": str(REPO)})

    def reboot(self, boot_s: float = 180) -> None:
        images.podman("restart", "--time", "30", self.name, timeout=300)
        self.wait_booted(boot_s)

    def remove(self) -> None:
        images.podman("rm", "--force", "--time", "10", self.name, timeout=120, check=False)
