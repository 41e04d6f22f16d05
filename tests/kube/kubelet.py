"""The API double's kubelet with podman: each pod a container of its image on a podman network.

Used by ``tests/kube/apiserver.py --podman-network NET`` (the chart run as containers,
tests/kube/containers.py): a notebook pod that KubeGpuSpawner creates runs as a container of
the image it names, with its command, args, environment and security context, on the
network where the hub reaches it at the container's own address (the pod IP).
An image not on this machine fails the pod as an image that cannot be pulled does.
"""

from __future__ import annotations

import tempfile
from typing import Any

from tests.kube.containers import podman_command, security_flags
from tests.kube.images import ULIMITS, exists, podman

Obj = dict[str, Any]


class ContainerFailedError(RuntimeError):
    def __init__(self, message: str, image: bool = False) -> None:
        super().__init__(message)
        self.image = image


class PodmanKubelet:
    def __init__(self, network: str) -> None:
        self.network = network

    def container(self, namespace: str, name: str) -> str:
        return f"{self.network}-pod-{namespace}-{name}"

    def start(self, pod: Obj) -> str:
        """Start the pod's first container; its address on the network (the pod IP)."""
        spec, meta = pod["spec"], pod["metadata"]
        container = spec["containers"][0]
        if not exists(container["image"]):
            raise ContainerFailedError(f'Failed to pull image "{container["image"]}": not on this machine', image=True)
        name = self.container(meta["namespace"], meta["name"])
        # The environment holds the server's API token: a file only podman reads, not argv.
        with tempfile.NamedTemporaryFile("w", prefix="gpuslice-pod-env-") as env:
            env.write("".join(f"{e['name']}={e.get('value', '')}\n" for e in container.get("env") or []))
            env.flush()
            started = podman(
                "run", "--detach", "--name", name, f"--hostname={meta['name']}", f"--network={self.network}",
                *ULIMITS, *security_flags(spec, container), f"--env-file={env.name}", *podman_command(container),
                check=False,
            )  # fmt: skip
        if started.returncode != 0:
            raise ContainerFailedError(started.stderr.strip()[-2000:])
        template = '{{(index .NetworkSettings.Networks "' + self.network + '").IPAddress}}'
        return podman("inspect", "--format", template, name).stdout.strip()

    def exit_code(self, namespace: str, name: str) -> int | None:
        """None while it runs; its exit code once it exited; -1 when the container is gone."""
        found = podman(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.container(namespace, name), check=False
        )
        if found.returncode != 0:
            return -1
        state, code = found.stdout.split()
        return int(code) if state in ("exited", "stopped") else None

    def remove(self, namespace: str, name: str) -> None:
        podman("rm", "--force", "--time", "10", self.container(namespace, name), check=False)
