"""The API double's kubelets: each pod a local process, or a podman container of its image.

``ProcessKubelet`` (the default) runs a pod's first container command (``sleep infinity``
for a pod that names none) as a local process bound to the pod's own loopback address
(127.A.B.N, A.B from the double's process id: ``pod_addresses``), with the pod's environment,
in a folder of its own whose ``container.log`` is its log; volumes are not mounted (the
process sees this machine's files).
A command of the container's is exec'd the same way (``exec_argv``: its environment, its folder).

``PodmanKubelet`` (``tests/kube/apiserver.py --podman-network NET``) runs each pod as a container
of the image it names (``images`` maps an image a cluster would pull to one built here), with
its command, args, environment (``value``, ``valueFrom`` of ConfigMaps, Secrets and the pod's
fields, ``envFrom``), security context, and volumes at their mount paths (``configMap``,
``secret``, ``projected`` of those, ``emptyDir``, ``persistentVolumeClaim`` as a folder kept for
the claim, ``subPath``, ``items``, ``defaultMode``, ``readOnly``), on the network where each
Service that selects the pod resolves to the pod's address (``NAME``, ``NAME.NS``,
``NAME.NS.svc``, ``NAME.NS.svc.cluster.local``: a headless Service's answer, so a Service's
``port`` must be its ``targetPort``). ``podman exec`` and ``podman logs`` serve exec and logs.
An image not on this machine fails the pod as an image that cannot be pulled does.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kube.containers import expand, podman_command, security_flags, service_links
from tests.kube.images import ULIMITS, exists, podman, podman_env, revive_dns

Obj = dict[str, Any]
Lookup = Callable[[str, str, str], Obj | None]  # (resource, namespace, name) -> stored object


class ContainerFailedError(RuntimeError):
    def __init__(self, message: str, image: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.image = image
        self.reason = reason or ("ErrImagePull" if image else "Error")


def pod_addresses(pid: int) -> Iterator[str]:
    """Loopback addresses for one API double's pods, apart from every other double's.

    Each pod's server listens on its own address at the image's port (8888): two doubles
    running at once (pytest's workers) that both counted from 127.0.0.2 gave their first pods
    the same address, and the second server could not bind ("port 8888 is already in use").
    Each double counts in a /24 named by its process id's low 16 bits: two doubles running at
    once differ there unless their ids are 65,536 apart. 253 pods a double, more than any test
    starts.
    """
    high, low = (pid >> 8) & 0xFF, pid & 0xFF
    return (f"127.{high}.{low}.{n}" for n in range(2, 255))


@dataclass
class Sandbox:
    """What the kubelet prepares before a container starts: environment, mounts, names."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)  # (host path, mount path, read-only)
    aliases: list[str] = field(default_factory=list)


def _decoded(obj: Obj, secret: bool) -> dict[str, bytes]:
    if secret:
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def field_of(pod: Obj, path: str, address: str = "") -> str:
    meta, spec = pod["metadata"], pod["spec"]
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": "127.0.0.1",
        "status.podIP": address,
    }
    if path.startswith(("metadata.labels['", "metadata.annotations['")):
        which, key = path.split("['", 1)
        return str((meta.get(which.split(".")[1]) or {}).get(key.rstrip("']"), ""))
    if path not in values:
        raise ContainerFailedError(
            f"fieldRef {path} is not supported by the double's kubelet", reason="CreateContainerConfigError"
        )
    return values[path]


def sandbox(pod: Obj, lookup: Lookup, services: list[Obj], root: Path) -> Sandbox:
    """The pod's environment and volumes from the objects they name (CreateContainerConfigError if one is missing)."""
    meta, spec = pod["metadata"], pod["spec"]
    namespace, container = meta["namespace"], spec["containers"][0]
    made = Sandbox(env=service_links(services) if spec.get("enableServiceLinks", True) else {})

    def source(kind: str, name: str, optional: bool, volume: str = "") -> dict[str, bytes] | None:
        obj = lookup("secrets" if kind == "secret" else "configmaps", namespace, name)
        if obj is None and not optional and volume:  # the kubelet's volume manager waits for it
            why = f'MountVolume.SetUp failed for volume "{volume}" : {kind} "{name}" not found'
            raise ContainerFailedError(why, reason="FailedMount")
        if obj is None and not optional:
            raise ContainerFailedError(f'{kind} "{name}" not found', reason="CreateContainerConfigError")
        return None if obj is None else _decoded(obj, kind == "secret")

    for item in container.get("envFrom") or []:
        for kind, ref in (("configmap", item.get("configMapRef")), ("secret", item.get("secretRef"))):
            if ref:
                data = source(kind, ref["name"], bool(ref.get("optional"))) or {}
                made.env.update({item.get("prefix", "") + k: v.decode() for k, v in data.items()})
    for item in container.get("env") or []:
        origin = item.get("valueFrom") or {}
        if "value" in item or not origin:
            made.env[item["name"]] = str(item.get("value", ""))
        elif "fieldRef" in origin:
            made.env[item["name"]] = field_of(pod, origin["fieldRef"]["fieldPath"])
        else:
            kind, ref = (
                ("secret", origin["secretKeyRef"])
                if "secretKeyRef" in origin
                else ("configmap", origin["configMapKeyRef"])
            )
            values = source(kind, ref["name"], bool(ref.get("optional")))
            if values is not None and ref["key"] in values:
                made.env[item["name"]] = values[ref["key"]].decode()
            elif not ref.get("optional"):
                raise ContainerFailedError(
                    f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}",
                    reason="CreateContainerConfigError",
                )
    folders = {v["name"]: _volume(v, pod, lookup, root, source) for v in spec.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        folder = folders[mount["name"]]
        path = folder / mount["subPath"] if mount.get("subPath") else folder
        made.mounts.append((path, mount["mountPath"], bool(mount.get("readOnly"))))
    labels = meta.get("labels") or {}
    for service in services:
        selector = service.get("spec", {}).get("selector") or {}
        if selector and selector.items() <= labels.items():
            name = service["metadata"]["name"]
            made.aliases += [
                name,
                f"{name}.{namespace}",
                f"{name}.{namespace}.svc",
                f"{name}.{namespace}.svc.cluster.local",
            ]
    return made


def _volume(volume: Obj, pod: Obj, lookup: Lookup, root: Path, source: Callable[..., dict[str, bytes] | None]) -> Path:
    meta = pod["metadata"]
    folder = root / "pods" / meta["namespace"] / meta["name"] / "volumes" / volume["name"]
    if "persistentVolumeClaim" in volume:  # the provisioner's folder: outlives the pod, writable by all
        claim_name = volume["persistentVolumeClaim"]["claimName"]
        claim = lookup("persistentvolumeclaims", meta["namespace"], claim_name)
        if claim is None:
            missing = f'persistentvolumeclaim "{claim_name}" not found'
            why = f'MountVolume.SetUp failed for volume "{volume["name"]}" : {missing}'
            raise ContainerFailedError(why, reason="FailedMount")
        folder = root / "claims" / claim["metadata"]["uid"]
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if "emptyDir" in volume:
        folder.chmod(0o777)
        return folder
    projections = volume["projected"]["sources"] if "projected" in volume else [volume]
    mode = (volume.get("projected") or volume.get("secret") or volume.get("configMap") or {}).get("defaultMode", 0o644)
    for projection in projections:
        if "configMap" in projection or "secret" in projection:
            kind = "secret" if "secret" in projection else "configmap"
            ref = projection.get("secret") or projection["configMap"]
            data = (
                source(kind, ref.get("secretName") or ref.get("name"), bool(ref.get("optional")), volume["name"]) or {}
            )
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                path = folder / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[item["key"]])
                path.chmod(item.get("mode", mode))
        elif "downwardAPI" in projection:
            for item in projection["downwardAPI"].get("items") or []:
                (folder / item["path"]).write_text(field_of(pod, item["fieldRef"]["fieldPath"]))
        else:
            raise ContainerFailedError(
                f"volume {volume['name']}: a kind the double's kubelet does not mount",
                reason="CreateContainerConfigError",
            )
    return folder


def container_key(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


class ProcessKubelet:
    """Pods as local processes on loopback addresses of their own."""

    poll_s = 0.5  # how often the kubelet looks whether a container exited

    def __init__(self, root: Path) -> None:
        self.root = root
        self.addresses = pod_addresses(os.getpid())
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.environments: dict[str, dict[str, str]] = {}
        self.folders: dict[str, Path] = {}

    def folder(self, pod: Obj) -> Path:
        """The pod's own folder: under the pod's GPUSLICE_DOUBLE_ROOT when its environment names one."""
        return self.folders.get(container_key(pod), self.root / pod["metadata"]["name"])

    def start(self, pod: Obj, made: Sandbox) -> str:
        container = pod["spec"]["containers"][0]
        # A pod that names no command runs its image's entrypoint, which no image here tells:
        # an idle process stands for it (it runs until the pod is deleted, as a batch job would).
        command = [*(container.get("command") or []), *(container.get("args") or [])] or ["sleep", "infinity"]
        address = next(self.addresses)
        env = {**os.environ, **made.env}
        port = int((container.get("ports") or [{"containerPort": 8888}])[0]["containerPort"])
        env["JUPYTERHUB_SERVICE_URL"] = f"http://{address}:{port}{env.get('JUPYTERHUB_SERVICE_PREFIX', '/')}"
        program = command[0]
        if not os.path.isabs(program) and Path(sys.executable).with_name(program).exists():
            program = str(Path(sys.executable).with_name(program))  # the double's venv's, as the image's
        if Path(program).name.startswith("jupyter"):  # a server: bound to the pod's own address
            command = [*(a for a in command[1:] if not a.startswith("--ip")), f"--ip={address}"]
            if os.geteuid() == 0:
                command.append("--allow-root")  # a real image runs as uid 1000; the double runs as the test's user
        else:
            command = command[1:]
        key = container_key(pod)
        workdir = Path(made.env.get("GPUSLICE_DOUBLE_ROOT") or self.root) / pod["metadata"]["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        self.folders[key] = workdir
        log = (workdir / "container.log").open("ab")
        self.environments[key] = env
        self.processes[key] = subprocess.Popen(
            [program, *command], env=env, cwd=workdir, stdout=log, stderr=log, start_new_session=True
        )
        return address

    def exit_code(self, pod: Obj) -> int | None:
        """None while it runs; its exit code once it exited (128 + N when killed by signal N, as a
        container runtime reports it); -1 when it is gone (stopped by the kubelet)."""
        process = self.processes.get(container_key(pod))
        if process is None:
            return -1
        code = process.poll()
        return 128 - code if code is not None and code < 0 else code

    def stop(self, pod: Obj, grace: float) -> None:
        process = self.processes.pop(container_key(pod), None)
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        try:
            process.wait(timeout=max(grace, 1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def exec_argv(self, pod: Obj, command: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The command run as the pod's process runs: its environment, its folder."""
        env = self.environments.get(container_key(pod), dict(os.environ))
        found = shutil.which(command[0], path=env.get("PATH")) or command[0]
        return [found, *command[1:]], {"env": env, "cwd": self.folder(pod)}

    def log_argv(self, pod: Obj, follow: bool, tail: int | None) -> tuple[list[str], dict[str, Any]]:
        log = self.folder(pod) / "container.log"
        argv = ["tail", "-n", str(tail) if tail is not None else "+1"]
        process = self.processes.get(container_key(pod))
        if follow and process is not None:
            argv += [f"--pid={process.pid}", "-F"]
        return [*argv, str(log)], {}


class PodmanKubelet:
    poll_s = 2.0  # each look is a podman process: less often than for a local process

    def __init__(self, network: str, root: Path, images: dict[str, str] | None = None) -> None:
        self.network = network
        self.root = root
        self.images = images or {}
        self.ids: dict[str, str] = {}  # each started pod's container, by pod UID

    def container(self, pod: Obj) -> str:
        return f"{self.network}-pod-{pod['metadata']['namespace']}-{pod['metadata']['name']}"

    def image(self, pod: Obj) -> str:
        wanted = pod["spec"]["containers"][0]["image"]
        return self.images.get(wanted, wanted)

    def start(self, pod: Obj, made: Sandbox) -> str:
        """Start the pod's first container; its address on the network (the pod IP)."""
        spec, meta = pod["spec"], pod["metadata"]
        container = {**spec["containers"][0], "image": self.image(pod)}
        for part in ("command", "args"):
            if container.get(part):
                container[part] = [expand(str(word), made.env) for word in container[part]]
        if not exists(container["image"]):
            raise ContainerFailedError(
                f'Failed to pull image "{spec["containers"][0]["image"]}": not on this machine', image=True
            )
        name = self.container(pod)
        # A pod made again under a deleted one's name (KubeSpawner restarts a server so) gets a fresh
        # container, as a kubelet names containers by pod UID; the old one may still be in its grace period.
        podman("rm", "--force", "--time", "0", name, check=False)
        mounts = [f"--volume={host}:{path}:{'ro' if ro else 'rw'}" for host, path, ro in made.mounts]
        aliases = [f"--network-alias={alias}" for alias in made.aliases]
        # The environment holds the server's API token: a file only podman reads, not argv.
        with tempfile.NamedTemporaryFile("w", prefix="gpuslice-pod-env-") as env:
            env.write("".join(f"{k}={v}\n" for k, v in made.env.items()))
            env.flush()
            started = podman(
                "run", "--detach", "--name", name, f"--hostname={meta['name']}", f"--network={self.network}",
                *aliases, *ULIMITS, *security_flags(spec, container), *mounts, f"--env-file={env.name}",
                *podman_command(container), check=False,
            )  # fmt: skip
        if started.returncode != 0:
            raise ContainerFailedError(started.stderr.strip()[-2000:])
        self.ids[pod["metadata"]["uid"]] = started.stdout.strip().splitlines()[-1]  # `run --detach` prints it
        template = '{{(index .NetworkSettings.Networks "' + self.network + '").IPAddress}}'
        return podman("inspect", "--format", template, name).stdout.strip()

    def exit_code(self, pod: Obj) -> int | None:
        """None while it runs; its exit code once it exited; -1 when the container is gone."""
        found = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.container(pod), check=False)
        if found.returncode != 0:
            return -1
        state, code = found.stdout.split()
        if state in ("exited", "stopped"):
            return int(code)
        revive_dns(self.network)  # a running pod's Service names resolve (podman's name server may exit)
        return None

    def stop(self, pod: Obj, grace: float) -> None:
        # By the container's ID, not its name: a pod made again under this name may be starting already.
        container = self.ids.pop(pod["metadata"]["uid"], self.container(pod))
        podman("rm", "--force", "--time", str(int(grace)), container, check=False)

    def exec_argv(self, pod: Obj, command: list[str]) -> tuple[list[str], dict[str, Any]]:
        return ["podman", "exec", "--interactive", self.container(pod), *command], {"env": podman_env()}

    def log_argv(self, pod: Obj, follow: bool, tail: int | None) -> tuple[list[str], dict[str, Any]]:
        argv = [
            "podman",
            "logs",
            *(["--follow"] if follow else []),
            *(["--tail", str(tail)] if tail is not None else []),
        ]
        return [*argv, self.container(pod)], {"env": podman_env()}


def image_map(text: str) -> dict[str, str]:
    """``--images FILE``: {image a cluster would pull: image built here}."""
    found: dict[str, str] = json.loads(text)
    return found
