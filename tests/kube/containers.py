"""A rendered Helm chart run as podman containers, against the Kubernetes API double.

What a kubelet does with a pod, done with podman for the objects ``helm template`` renders:

* every Deployment (one replica) and DaemonSet (one pod per node) becomes a container of the
  image the pod names, with the pod's ``command`` (the image's entrypoint replaced) and
  ``args`` (its CMD replaced), its environment (``value``, ``secretKeyRef``,
  ``configMapKeyRef``, ``fieldRef`` of the namespace and name), its volumes at their mount
  paths (ConfigMap and Secret items as files, ``subPath`` mounts of one of them, a
  PersistentVolumeClaim as a folder kept across restarts and upgrades, ``emptyDir`` as a
  folder of the pod), its security context
  (user, read-only root, dropped capabilities, no new privileges), and it is started again
  when it exits (``restartPolicy: Always``, by a thread of the harness, the kubelet's job);
* the pod's service account gets a token, mounted with the API's CA and the namespace at
  ``/var/run/secrets/kubernetes.io/serviceaccount`` (unless ``automountServiceAccountToken``
  is false), and ``KUBERNETES_SERVICE_HOST``/``PORT`` name the API double, served over TLS
  with that CA and enforcing the RBAC the chart renders for that account;
* each Service's name resolves, on the podman network, to the pod its selector picks
  (a network alias), and each pod gets the Services' ``NAME_SERVICE_HOST``/``_PORT``
  variables (``enableServiceLinks``; the host is the Service's name, which resolves);
  ``$(VAR)`` in a command or args is expanded from the container's environment;
* an image a cluster would pull runs as the image built here that ``pulls`` names for it.

Notebook pods that the hub creates are run by the double's kubelet as containers of the
notebook image on the same network (``tests/kube/apiserver.py --podman-network``).
``start_prometheus`` adds a real Prometheus scraping the exporter pods through their headless
Service, for the chart's ``monitoring.prometheusUrl``.
Not done: NetworkPolicies are not enforced, probes are not run (the test waits for the
readiness endpoints itself), resource limits are not applied.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.e2e.platform import free_port
from tests.helm.test_chart import CHART, helm
from tests.kube.images import ULIMITS, podman, revive_dns

Obj = dict[str, Any]
ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
RELEASE, NAMESPACE = "gs", "jupyter"


def render(values: Obj, folder: Path) -> list[Obj]:
    """``helm template`` of the chart with these values (the release gs in namespace jupyter)."""
    given = folder / "values.yaml"
    given.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(given)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rule_groups(docs: list[Obj]) -> list[Obj]:
    """The groups of every rendered PrometheusRule (monitoring.operator), as one rule file holds them."""
    return [group for doc in docs if doc["kind"] == "PrometheusRule" for group in doc["spec"]["groups"]]


def check_rules(path: Path) -> None:
    """promtool's check of a rule file (Debian's, beside the prometheus binary); its words on failure."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("no promtool on PATH (scripts/setup installs Debian's prometheus)")
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    if checked.returncode != 0:
        raise RuntimeError(f"promtool check rules {path} failed:\n{checked.stdout}{checked.stderr}")


def keep_generated_secrets(docs: list[Obj], installed: list[Obj]) -> None:
    """What the chart's ``lookup`` does on an upgrade: a Secret's keys already installed are kept."""
    old = {d["metadata"]["name"]: d for d in installed if d["kind"] == "Secret"}
    for doc in docs:
        if doc["kind"] == "Secret" and doc["metadata"]["name"] in old:
            doc["data"].update(old[doc["metadata"]["name"]].get("data") or {})


def make_tls(folder: Path, address: str) -> tuple[Path, Path, Path]:
    """A CA and the API server's certificate for address (and kubernetes.default.svc): ca, cert, key."""
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.crt", "api.key", "api.csr", "api.crt"))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
            "-days", "2", "-subj", "/CN=gpuslice-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=kube-apiserver")  # fmt: skip
    extensions = folder / "san.cnf"
    extensions.write_text(f"subjectAltName=IP:{address},IP:127.0.0.1,DNS:kubernetes.default.svc,DNS:kubernetes\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(extensions))  # fmt: skip
    return ca, cert, key


def podman_command(container: Obj) -> list[str]:
    """Kubernetes' command/args over the image's ENTRYPOINT/CMD, as podman run arguments after the flags."""
    command, args = container.get("command"), container.get("args")
    entrypoint = ["--entrypoint", json.dumps(command)] if command else []
    return [*entrypoint, container["image"], *(args or [])]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) in a command or args: the variable's value when defined, else left as is; $$ escapes."""
    return re.sub(
        r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))",
        lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)),
        text,
    )


def service_links(services: list[Obj]) -> dict[str, str]:
    """What the kubelet adds for each Service of the namespace (enableServiceLinks): NAME_SERVICE_HOST and
    NAME_SERVICE_PORT[_PORTNAME]; the host is the Service's name, which the network resolves to its pod."""
    env: dict[str, str] = {}
    for service in services:
        ports = service.get("spec", {}).get("ports") or []
        if not ports:
            continue
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        env[f"{prefix}_SERVICE_HOST"] = service["metadata"]["name"]
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
    return env


def security_flags(pod_spec: Obj, container: Obj) -> list[str]:
    pod_security, security = pod_spec.get("securityContext") or {}, container.get("securityContext") or {}
    user = security.get("runAsUser", pod_security.get("runAsUser"))
    group = security.get("runAsGroup", pod_security.get("runAsGroup", user))
    flags = [f"--user={user}:{group}"] if user is not None else []
    if pod_security.get("fsGroup") is not None:
        flags.append(f"--group-add={pod_security['fsGroup']}")
    if security.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if "ALL" in ((security.get("capabilities") or {}).get("drop") or []):
        flags.append("--cap-drop=all")
    if security.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    return flags


@dataclass
class Cluster:
    """The chart's workloads as containers on one podman network, and the API double they use."""

    root: Path
    nodes: list[Obj]
    docs: list[Obj] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # images/ folder -> built image
    network: str = ""
    gateway: str = ""
    api_port: int = 0
    api: subprocess.Popen[bytes] | None = None
    tokens: dict[str, str] = field(default_factory=dict)  # service account -> token
    containers: dict[str, str] = field(default_factory=dict)  # workload name -> container
    published: dict[tuple[str, int], int] = field(default_factory=dict)  # (workload, port) -> host port
    restarts: dict[str, int] = field(default_factory=dict)  # container -> times restarted
    dns_revived: int = 0  # times the network's name server stopped answering and was started again
    stopping: threading.Event = field(default_factory=threading.Event)
    kubelet: threading.Thread | None = None
    namespace: str = NAMESPACE
    pulls: dict[str, str] = field(default_factory=dict)  # image a cluster pulls -> image built here
    reader: str = f"{RELEASE}-gpuslice-hub"  # the service account k8s() reads the API as
    rbac_extra: list[Obj] = field(default_factory=list)  # RBAC objects besides the rendered ones
    tokens_extra: dict[str, str] = field(default_factory=dict)  # token -> user, besides the accounts'
    api_args: tuple[str, ...] = ()

    # -- the objects ---------------------------------------------------------------------

    def objects(self, kind: str) -> list[Obj]:
        return [d for d in self.docs if d["kind"] == kind]

    def named(self, kind: str, name: str) -> Obj:
        return next(d for d in self.objects(kind) if d["metadata"]["name"] == name)

    def secret_value(self, name: str, key: str) -> str:
        return base64.b64decode(self.named("Secret", name)["data"][key]).decode()

    # -- the network and the API ------------------------------------------------------

    def create_network(self) -> None:
        self.network = f"gpuslice-{secrets.token_hex(4)}"
        for _ in range(20):  # a free /24 among those other tests may hold
            third = secrets.randbelow(200) + 20
            made = podman("network", "create", "--subnet", f"10.89.{third}.0/24", self.network, check=False)
            if made.returncode == 0:
                self.gateway = f"10.89.{third}.1"
                return
        raise RuntimeError(f"no free podman subnet: {made.stderr}")

    def start_api(self) -> None:
        """The API double over TLS (CA in the pods' service-account folder), with the chart's RBAC."""
        ca, cert, key = make_tls(self.root, self.gateway)
        self.ca: Path = ca
        rbac_kinds = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
        accounts = ["default", *(d["metadata"]["name"] for d in self.objects("ServiceAccount"))]
        self.tokens = {name: secrets.token_urlsafe(32) for name in accounts}
        rbac = {
            "tokens": {
                **{t: f"system:serviceaccount:{self.namespace}:{a}" for a, t in self.tokens.items()},
                **self.tokens_extra,
            },
            "objects": [self._namespaced(d) for d in [*self.docs, *self.rbac_extra] if d["kind"] in rbac_kinds],
        }
        (self.root / "images.json").write_text(json.dumps(self.pulls))
        (self.root / "rbac.json").write_text(json.dumps(rbac))
        (self.root / "nodes.json").write_text(json.dumps(self.nodes))
        self.api_port = free_port()
        log = (self.root / "apiserver.log").open("ab")
        self.api = subprocess.Popen(
            [sys.executable, "-m", "tests.kube.apiserver", "--host", "0.0.0.0", "--port", str(self.api_port),
             "--nodes", str(self.root / "nodes.json"), "--rbac", str(self.root / "rbac.json"),
             "--tls-cert", str(cert), "--tls-key", str(key), "--podman-network", self.network,
             "--namespaces", self.namespace, "--images", str(self.root / "images.json"), *self.api_args],
            stdout=log, stderr=log, cwd=Path(__file__).parents[2],
        )  # fmt: skip
        self.wait_for(f"https://127.0.0.1:{self.api_port}/version", verify=str(ca))

    def _namespaced(self, doc: Obj) -> Obj:
        """What the API server stores: namespaced objects in the release's namespace."""
        if doc["kind"] in ("Role", "RoleBinding") and not doc["metadata"].get("namespace"):
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": self.namespace}}
        return doc

    def k8s(self, path: str) -> Any:
        """The double as the test reads it (with the hub's account, over TLS)."""
        response = requests.get(
            f"https://{self.gateway}:{self.api_port}{path}",
            headers={"Authorization": f"Bearer {self.tokens[self.reader]}"},
            verify=str(self.ca),
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    @staticmethod
    def wait_for(url: str, timeout_s: float = 120, verify: bool | str = True, ok: tuple[int, ...] = (200,)) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                response = requests.get(url, timeout=5, verify=verify, allow_redirects=False)
                if response.status_code in ok:
                    return
                last = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                last = str(exc)
            time.sleep(0.5)
        raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s: {last}")

    # -- the workloads ----------------------------------------------------------------

    def apply(self, docs: list[Obj], publish: dict[str, list[int]] | None = None, only: set[str] | None = None) -> None:
        """Run (or replace, as a rollout does) every Deployment and DaemonSet of docs (or those named in only)."""
        self.docs = docs
        if self.kubelet is None:
            self.kubelet = threading.Thread(target=self.restart_exited, daemon=True)
            self.kubelet.start()
        for workload in self.objects("Deployment"):
            if only is not None and workload["metadata"]["name"] not in only:
                continue
            self.run_pod(workload["metadata"]["name"], workload["spec"]["template"], publish or {})
        for workload in self.objects("DaemonSet") if only is None else []:
            for node in self.nodes:
                name = f"{workload['metadata']['name']}-{node['metadata']['name']}"
                self.run_pod(name, workload["spec"]["template"], publish or {}, node=node["metadata"]["name"])

    def restart_exited(self) -> None:
        """The kubelet's restartPolicy Always, every second: a workload container that exited starts again.
        And the network's name server, should podman's stop answering on it (``revive_dns``)."""
        while not self.stopping.wait(1):
            if self.containers and revive_dns(self.network):
                self.dns_revived += 1
                with (self.root / "harness.log").open("a") as log:  # read after a failure
                    log.write(f"{time.strftime('%H:%M:%S')} podman's name server restarted for {self.network}\n")
            exited = podman(
                "ps", "--all", "--filter", "status=exited", "--filter", f"network={self.network}",
                "--format", "{{.Names}}", check=False,
            ).stdout.split()  # fmt: skip
            for container in set(exited) & set(self.containers.values()):
                podman("start", container, check=False)
                self.restarts[container] = self.restarts.get(container, 0) + 1

    def run_pod(self, name: str, template: Obj, publish: dict[str, list[int]], node: str = "") -> None:
        spec, labels = template["spec"], template["metadata"].get("labels") or {}
        container = dict(spec["containers"][0])
        container["image"] = self.pulls.get(container["image"], container["image"])
        pod = self.root / "pods" / name
        old = self.containers.pop(name, None)
        if old:  # a rollout: the old pod goes first (the hub's strategy is Recreate)
            podman("rm", "--force", "--time", "10", old, check=False)
        if pod.exists():
            subprocess.run(["rm", "-rf", str(pod)], check=True)
        pod.mkdir(parents=True)
        mounts = self._volumes(spec, container, pod)
        env = self._env(container, name, node)
        for part in ("command", "args"):
            if container.get(part):
                container[part] = [expand(str(word), env) for word in container[part]]
        (pod / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        (pod / "env").chmod(0o600)
        aliases = [
            f"--network-alias={s['metadata']['name']}"
            for s in self.objects("Service")
            if (s["spec"].get("selector") or {}).items() <= labels.items() and s["spec"].get("selector")
        ]
        ports = [
            f"--publish=127.0.0.1:{self.published.setdefault((name, port), free_port())}:{port}"
            for port in publish.get(name, [])
        ]
        container_name = f"{self.network}-{name}"
        podman(
            "run", "--detach", "--name", container_name, f"--hostname={name}", f"--network={self.network}",
            *aliases, *ports, *ULIMITS, f"--env-file={pod / 'env'}",
            *security_flags(spec, container), *mounts, *podman_command(container),
        )  # fmt: skip
        self.containers[name] = container_name

    def _env(self, container: Obj, pod_name: str, node: str) -> dict[str, str]:
        env = service_links(self.objects("Service"))
        env.update({"KUBERNETES_SERVICE_HOST": self.gateway, "KUBERNETES_SERVICE_PORT": str(self.api_port)})
        fields = {"metadata.namespace": self.namespace, "metadata.name": pod_name, "spec.nodeName": node}
        for item in container.get("env") or []:
            source = item.get("valueFrom") or {}
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "secretKeyRef" in source:
                env[item["name"]] = self.secret_value(source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[item["name"]] = self.named("ConfigMap", ref["name"])["data"][ref["key"]]
            elif "fieldRef" in source:
                env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
            else:
                raise ValueError(f"{pod_name}: env {item['name']} comes from {source}, which the harness cannot give")
        return env

    def _volumes(self, spec: Obj, container: Obj, pod: Path) -> list[str]:
        folders: dict[str, Path] = {}
        for volume in spec.get("volumes") or []:
            folders[volume["name"]] = self._volume(volume, pod)
        flags = []
        for mount in container.get("volumeMounts") or []:
            mode = "ro" if mount.get("readOnly") else "rw"
            source = folders[mount["name"]] / mount["subPath"] if mount.get("subPath") else folders[mount["name"]]
            flags.append(f"--volume={source}:{mount['mountPath']}:{mode}")
        if spec.get("automountServiceAccountToken", True) is not False:
            account = pod / "serviceaccount"
            account.mkdir()
            (account / "token").write_text(self.tokens[spec.get("serviceAccountName") or "default"])
            (account / "ca.crt").write_bytes(self.ca.read_bytes())
            (account / "namespace").write_text(self.namespace)
            flags.append(f"--volume={account}:{ACCOUNT}:ro")
        return flags

    def _volume(self, volume: Obj, pod: Path) -> Path:
        folder = pod / "volumes" / volume["name"]
        if "persistentVolumeClaim" in volume:  # outlives the pod: kept across restarts and upgrades
            folder = self.root / "claims" / volume["persistentVolumeClaim"]["claimName"]
        folder.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume or "secret" in volume:
            self._write_items(volume, folder)
        subprocess.run(["chown", "-R", "1000:1000", str(folder)], check=True)  # fsGroup 1000
        return folder

    def _write_items(self, volume: Obj, folder: Path) -> None:
        if "configMap" in volume:
            source = volume["configMap"]
            data = {k: v.encode() for k, v in self.named("ConfigMap", source["name"])["data"].items()}
        else:
            source = volume["secret"]
            encoded = self.named("Secret", source["secretName"])["data"]
            data = {k: base64.b64decode(v) for k, v in encoded.items()}
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            path = folder / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])

    def start_prometheus(
        self, service: str, port: int, name: str = "prometheus", rule_groups: list[Obj] | None = None
    ) -> str:
        """A real Prometheus (Debian's binary, the one the single-machine platform runs) in a container
        of the Debian base on the network, its address the chart's ``monitoring.prometheusUrl``.

        It finds the exporter pods as a cluster's Prometheus finds a headless Service's endpoints:
        the Service's name resolves to every pod it selects (``dns_sd_configs``, type A). Returns
        its URL inside the network; the host reaches it at ``url(name, 9090)``. ``rule_groups``
        (the rendered PrometheusRule's ``spec.groups``, as the operator hands them to its Prometheus)
        are written as a rule file, checked by promtool first and loaded.
        """
        from tests.kube.images import debian_base

        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("no prometheus on PATH (scripts/setup installs Debian's)")
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        scrape = {"names": [service], "type": "A", "port": port, "refresh_interval": "2s"}
        config = {
            "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
            "scrape_configs": [{"job_name": "gpuslice-exporter", "dns_sd_configs": [scrape]}],
        }
        if rule_groups:
            (folder / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups}))
            check_rules(folder / "rules.yml")
            config["rule_files"] = ["/etc/prometheus/rules.yml"]
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        host_port = self.published.setdefault((name, 9090), free_port())
        container = f"{self.network}-{name}"
        podman(
            "run", "--detach", "--name", container, f"--network={self.network}", f"--network-alias={name}",
            f"--publish=127.0.0.1:{host_port}:9090", *ULIMITS, "--user=65534:65534", "--read-only",
            "--tmpfs=/prometheus:rw,mode=1777", f"--volume={binary}:/usr/local/bin/prometheus:ro",
            f"--volume={folder}:/etc/prometheus:ro", "--entrypoint", "/usr/local/bin/prometheus", debian_base(),
            "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
            "--web.listen-address=:9090",
        )  # fmt: skip
        self.containers[name] = container
        self.wait_for(f"{self.url(name, 9090)}/-/ready", timeout_s=60)
        return f"http://{name}:9090"

    # -- what a test does -------------------------------------------------------------

    def kill(self, name: str) -> None:
        """The container's main process killed (SIGKILL); restartPolicy Always brings it back."""
        podman("kill", "--signal", "KILL", self.containers[name])

    def logs(self, name: str) -> str:
        result = podman("logs", "--tail", "80", self.containers[name], check=False)
        return result.stdout + result.stderr

    def url(self, name: str, port: int) -> str:
        return f"http://127.0.0.1:{self.published[(name, port)]}"

    def stop(self) -> None:
        self.stopping.set()
        if self.kubelet is not None:
            self.kubelet.join(timeout=30)
        if self.dns_revived:
            print(f"harness: podman's name server stopped answering on {self.network}: restarted {self.dns_revived}x")
        logs = self.root / "logs"  # every container's output, kept for a failure's reader
        logs.mkdir(exist_ok=True)
        for container in [*self.containers.values(), *self.notebook_containers()]:
            got = podman("logs", container, check=False)
            (logs / f"{container}.log").write_text(got.stdout + got.stderr)
        for container in self.containers.values():
            podman("rm", "--force", "--time", "5", container, check=False)
        for notebook in self.notebook_containers():
            podman("rm", "--force", "--time", "5", notebook, check=False)
        if self.api is not None:
            self.api.terminate()
            self.api.wait(timeout=30)
        if self.network:
            podman("network", "rm", "--force", self.network, check=False)

    def notebook_containers(self) -> Iterator[str]:
        listed = podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"network={self.network}", check=False)
        yield from (n for n in listed.stdout.split() if n not in self.containers.values())
