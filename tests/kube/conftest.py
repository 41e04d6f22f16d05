"""A real JupyterHub with KubeGpuSpawner against the Kubernetes API test double."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.platform import free_port

HERE = Path(__file__).parent
GiB = 2**30


def gpushare_node(name: str, cards: int, gib_per_card: int) -> dict[str, Any]:
    allocatable = {
        "cpu": "16",
        "memory": "64Gi",
        "pods": "110",
        "aliyun.com/gpu-count": str(cards),
        "aliyun.com/gpu-mem": str(cards * gib_per_card),
    }
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"aliyun.accelerator/nvidia_name": "Tesla-T4"}},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def write_kubeconfig(path: Path, port: int) -> None:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "hub", "user": {"token": "not-checked-by-the-double"}}],
                "contexts": [
                    {"name": "double", "context": {"cluster": "double", "user": "hub", "namespace": "gpuslice"}}
                ],
                "current-context": "double",
            }
        )
    )


def login(base: str, user: str, password: str) -> requests.Session:
    """A logged-in browser-like session (the hub's cookie) through the login form."""
    session = requests.Session()
    form = session.get(f"{base}/hub/login", timeout=30)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
    data = {"username": user, "password": password, **({"_xsrf": xsrf.group(1)} if xsrf else {})}
    answer = session.post(f"{base}/hub/login", data=data, timeout=60, allow_redirects=False)
    assert answer.status_code == 302, f"{user} could not log in: HTTP {answer.status_code}"
    return session


@dataclass
class KubeHub:
    root: Path
    url: str
    api_url: str
    token: str

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, timeout=60, **kwargs)

    def k8s(self, path: str) -> Any:
        response = requests.get(f"{self.api_url}{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def k8s_post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(f"{self.api_url}{path}", json=body, timeout=10)

    def progress_until(self, user: str, text: str, server: str = "") -> list[str]:
        """The spawn progress messages of user's server (default: the unnamed one), read until one contains text."""
        messages: list[str] = []
        path = f"servers/{server}" if server else "server"
        url = f"{self.url}/hub/api/users/{user}/{path}/progress"
        with requests.get(url, headers={"Authorization": f"token {self.token}"}, stream=True, timeout=60) as stream:
            for line in stream.iter_lines(decode_unicode=True):
                if line.startswith("data:"):
                    messages.append(json.loads(line[5:])["message"])
                    if text in messages[-1]:
                        return messages
        raise AssertionError(f"no progress message with {text!r} for {user}: {messages}")

    def hold_every_card_outside_the_hub(self, gib: int = 15) -> None:
        """Pods in another namespace take the cards: the hub's view (its namespace) sees room, the scheduler not."""
        for node in ("gpu-a", "gpu-b"):
            outsider = {
                "metadata": {"name": f"batch-{node}", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0"}},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {"name": "job", "image": "job", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}
                    ],
                },
            }
            created = self.k8s_post("/api/v1/namespaces/batch/pods", outsider)
            assert created.status_code == 201, created.text

    def wait_ready(self, user: str, timeout_s: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            server = self.api("GET", f"/users/{user}").json()["servers"].get("")
            if server and server.get("ready"):
                return dict(server)
            if not server or not server.get("pending"):
                raise AssertionError(f"{user}'s server stopped while starting: {server}; see {self.root}/hub.log")
            time.sleep(0.5)
        raise AssertionError(f"{user}'s server not ready in {timeout_s}s; see {self.root}/hub.log")


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited:\n{log.read_text()[-3000:]}"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")


def start_api_double(
    root: Path,
    nodes: list[dict[str, Any]],
    kubelet: bool = True,
    extra_args: tuple[str, ...] = (),
    namespaces: tuple[str, ...] = ("gpuslice",),
) -> tuple[subprocess.Popen[bytes], int]:
    """The Kubernetes API double in its own process, with these namespaces made; returns it and its port."""
    nodes_file = root / "nodes.json"
    nodes_file.write_text(json.dumps(nodes))
    api_port = free_port()
    api_log = (root / "apiserver.log").open("wb")
    command = [sys.executable, "-m", "tests.kube.apiserver", "--port", str(api_port), "--nodes", str(nodes_file)]
    command += ["--namespaces", ",".join(namespaces)]
    apiserver = subprocess.Popen(
        [*command, *([] if kubelet else ["--no-kubelet"]), *extra_args],
        stdout=api_log,
        stderr=api_log,
        cwd=HERE.parents[1],
    )
    _wait_http(f"http://127.0.0.1:{api_port}/version", apiserver, root / "apiserver.log")
    return apiserver, api_port


@pytest.fixture
def kube_hub(tmp_path: Path) -> Iterator[KubeHub]:
    nodes = [gpushare_node("gpu-a", 1, 15), gpushare_node("gpu-b", 1, 15)]
    apiserver, api_port = start_api_double(tmp_path, nodes, namespaces=("gpuslice", "batch"))
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, api_port)
    token = secrets.token_hex(16)
    env = dict(
        os.environ,
        KUBECONFIG=str(kubeconfig),
        GPUSLICE_TEST_DIR=str(tmp_path),
        GPUSLICE_TEST_PORT=str(port),
        GPUSLICE_TEST_HUB_PORT=str(free_port()),
        GPUSLICE_TEST_PROXY_PORT=str(free_port()),
        GPUSLICE_TEST_TOKEN=token,
        PYTHONPATH=str(HERE.parents[1]),
    )
    hub_log = (tmp_path / "hub.log").open("wb")
    hub = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(HERE / "jupyterhub_config.py")],
        env=env,
        cwd=tmp_path,
        stdout=hub_log,
        stderr=hub_log,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/hub/health", hub, tmp_path / "hub.log", timeout_s=90)
        yield KubeHub(tmp_path, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}", token)
    finally:
        for proc in (hub, apiserver):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
