"""The platform's container images, built with podman from images/*/Dockerfile.

There is no Docker engine and no reachable public image registry on these machines, but
Debian's podman builds and runs OCI images (../shared/CONTAINERS.md): the base is Debian
bookworm made from Debian's packages by ``mmdebstrap`` and imported as
``localhost/debian:bookworm``; every Dockerfile builds on it with ``--build-arg BASE=...``
(their default stays the public base a cluster pulls). The notebook image is the CPU
build of images/notebook-base (the same file, on Debian instead of the CUDA runtime).

An image's tag is a hash of its inputs (the Dockerfile, the base's name and every file
its COPY instructions take from the repository), so a second run, or CI on a machine
that already built it, finds it and builds nothing.

Run ``python -m tests.kube.images`` to build them all (the times are printed).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).parents[2]
IMAGES = REPO / "images"
BASE = "localhost/debian:bookworm"
# The images the chart runs (proxy, hub, portal, exporter) and the notebook image it spawns.
PLATFORM = ("notebook-base", "proxy", "exporter", "portal", "hub")
# Built side by side, each group in its order: the portal's image and the hub's first stage are the
# exporter's and more, so they are built after it, on the same thread, and find its layers made.
BUILT_TOGETHER = (("notebook-base",), ("exporter", "portal", "hub"), ("proxy",))
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# This sandbox's root may not raise rlimits above the host's hard limits (podman's defaults do).
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
CONTAINERS_CONF = """\
# Written by tests/kube/images.py: runc (crun fails on this machine's cgroups), rlimits
# within the host's hard limits.
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class PodmanMissingError(RuntimeError):
    """podman (or mmdebstrap) is not installed: scripts/setup installs them as root."""


def missing_tools() -> list[str]:
    return [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]


def podman_env() -> dict[str, str]:
    """The environment every podman call gets: our containers.conf (written once per machine)."""
    conf = Path(tempfile.gettempdir()) / "gpuslice-containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        # Whole or not at all: other builds (threads, the suite's other workers) read it meanwhile.
        fresh = conf.with_name(f"{conf.name}.{os.getpid()}.{threading.get_ident()}")
        fresh.write_text(CONTAINERS_CONF)
        fresh.replace(conf)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    if missing_tools():
        missing = ", ".join(missing_tools())
        raise PodmanMissingError(f"missing {missing}: run scripts/setup as root (apt-get installs them)")
    result = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def revive_dns(network: str) -> bool:
    """Start the containers' name server again on ``network`` if it stopped answering there.

    Debian bookworm's netavark and aardvark-dns (1.4) can lose it when containers of two networks start
    and stop at once: aardvark-dns rebinds every network's socket on each change, and can exit, or live
    on without this network's socket. Seen with the chart's and z2jh's harnesses side by side: as the
    other test took its network down, every Service name on the surviving network failed to resolve from
    then on (its Prometheus found no exporter, its portal no hub, its proxy no portal). netavark starts
    aardvark-dns again (or makes it rebind), with every network's names, when a container joins a
    network: a throwaway one does, once a dead one is reaped (netavark takes an unreaped one for
    running). Returns whether it had to."""
    if _listening(_gateway(network), 53):
        return False
    deadline = time.monotonic() + 10
    while _name_server_zombie() and time.monotonic() < deadline:
        time.sleep(0.2)
    podman("run", "--rm", *ULIMITS, f"--network={network}", "--entrypoint=true", BASE, check=False)
    return True


@functools.cache
def _gateway(network: str) -> str:
    """The network's gateway address, where podman's name server answers its containers."""
    return podman("network", "inspect", "--format", "{{range .Subnets}}{{.Gateway}}{{end}}", network).stdout.strip()


def _listening(address: str, port: int) -> bool:
    """Whether a UDP socket of this machine is bound to address:port (/proc/net/udp: little-endian hex)."""
    wanted = f"{socket.inet_aton(address)[::-1].hex().upper()}:{port:04X}"
    lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    return any(line.split()[1] == wanted for line in lines)


def _name_server_zombie() -> bool:
    """An aardvark-dns killed and not yet reaped: it keeps its pid, so netavark would not start another."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        name, _, rest = text.partition(" (")[2].rpartition(") ")
        if name == "aardvark-dns" and rest.startswith("Z"):
            return True
    return False


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


@contextmanager
def building(image: str) -> Iterator[bool]:
    """Held while ``image`` is made; yields whether it must still be made. The suite's workers (and the
    modules that need the same image: the chart, z2jh's hub, KubeSpawner's suite) may ask at once: the
    first builds, the others wait for it and find the image made."""
    lock = Path(tempfile.gettempdir()) / f"gpuslice-image-{hashlib.sha256(image.encode()).hexdigest()[:16]}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield not exists(image)


def debian_base() -> str:
    """localhost/debian:bookworm, made once per machine from Debian's packages (~40 s)."""
    with building(BASE) as missing:
        if missing:
            _make_debian_base()
    return BASE


def _make_debian_base() -> None:
    with tempfile.TemporaryDirectory(prefix="gpuslice-debian-") as folder:
        tar = Path(folder) / "debian.tar"
        subprocess.run(
            ["mmdebstrap", "--quiet", "--variant=minbase", "bookworm", str(tar)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        podman("import", str(tar), BASE)


def copied_sources(dockerfile: Path) -> list[Path]:
    """The repository paths a Dockerfile's COPY instructions take from the build context."""
    sources = []
    for instruction in DockerfileParser(str(dockerfile)).structure:
        if instruction["instruction"] == "COPY" and "--from" not in instruction["value"]:
            sources += [REPO / part for part in instruction["value"].split()[:-1]]
    return sources


def inputs_hash(name: str, base: str) -> str:
    """A hash of everything the build of images/<name> reads: Dockerfile, base name, copied files."""
    dockerfile = IMAGES / name / "Dockerfile"
    digest = hashlib.sha256(base.encode() + b"\0" + dockerfile.read_bytes())
    for source in copied_sources(dockerfile):
        files = sorted(source.rglob("*")) if source.is_dir() else [source]
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def image_name(name: str, base: str = BASE) -> str:
    return f"localhost/gpuslice-{name}:{inputs_hash(name, base)}"


def build(name: str, base: str | None = None, timeout: float = 900) -> str:
    """images/<name> built on base (default: the Debian base), unless an identical build exists."""
    base = base or debian_base()
    tag = image_name(name, base)
    with building(tag) as missing:
        if missing:
            _build(name, base, tag, timeout)
    return tag


def _build(name: str, base: str, tag: str, timeout: float) -> None:
    # The host's CA bundle for pip and npm (Dockerfiles: ARG PIP_CERT, ARG CA_BUNDLE), mounted
    # beside Debian's own: a mount over it breaks the ca-certificates package's install.
    ca = ["--volume", f"{HOST_CA}:/run/host-ca.crt:ro"]
    ca += ["--build-arg", "PIP_CERT=/run/host-ca.crt", "--build-arg", "CA_BUNDLE=/run/host-ca.crt"]
    podman(
        "build",
        "--network=host",
        *ULIMITS,
        *(ca if HOST_CA.exists() else []),
        "--build-arg",
        f"BASE={base}",
        "--file",
        str(IMAGES / name / "Dockerfile"),
        "--tag",
        tag,
        str(REPO),
        timeout=timeout,
    )


def build_platform() -> dict[str, str]:
    """Every image the chart runs, by its images/ folder name. Built three at a time: a build mostly
    waits on Debian's and PyPI's downloads (one took 143 s of which 18 s on a core), so one after
    another they kept the chart's test waiting ~24 minutes on CI."""
    debian_base()  # once, before the builds that start from it
    with ThreadPoolExecutor(max_workers=len(BUILT_TOGETHER), thread_name_prefix="podman-build") as pool:
        groups = pool.map(lambda names: {name: build(name) for name in names}, BUILT_TOGETHER)
        return {name: tag for group in groups for name, tag in group.items()}


def main() -> None:
    names = sys.argv[1:] or list(PLATFORM)
    started = time.monotonic()
    debian_base()
    print(f"base {BASE}: {time.monotonic() - started:.0f} s", flush=True)
    for name in names:
        began = time.monotonic()
        print(f"{name}: {build(name)} ({time.monotonic() - began:.0f} s)", flush=True)
    print(f"all: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
