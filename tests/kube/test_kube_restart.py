"""After a hub restart, a notebook pod that dies right after the hub's first look is noticed at once.

JupyterHub polls each server once at start, then only waits for an HTTP answer for
``http_timeout`` (60 s here). KubeGpuSpawner's first poll after a restart watches the pod
while it waits, as the local backend does: the dead server is gone in seconds.
"""

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.e2e.platform import free_port
from tests.kube.conftest import HERE, KubeHub, _wait_http, gpushare_node, start_api_double, write_kubeconfig

# KubeSpawner's pod reflector lists with a label selector: its first list means the hub is polling.
REFLECTOR_LIST = {"method": "GET", "path_contains": "/namespaces/gpuslice/pods", "query_contains": "labelSelector"}


class RestartableHub:
    def __init__(self, root: Path, api_port: int) -> None:
        self.root, self.port = root, free_port()
        kubeconfig = root / "kubeconfig"
        write_kubeconfig(kubeconfig, api_port)
        self.hub = KubeHub(root, f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{api_port}", secrets.token_hex(16))
        self.env = dict(
            os.environ,
            KUBECONFIG=str(kubeconfig),
            GPUSLICE_TEST_DIR=str(root),
            GPUSLICE_TEST_PORT=str(self.port),
            GPUSLICE_TEST_HUB_PORT=str(free_port()),
            GPUSLICE_TEST_PROXY_PORT=str(free_port()),
            GPUSLICE_TEST_TOKEN=self.hub.token,
            GPUSLICE_TEST_KEEP_SERVERS="1",
            PYTHONPATH=str(HERE.parents[1]),
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "hub.log").open("ab")
        config = str(HERE / "jupyterhub_config.py")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", config],
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: the processes of its container (kill_9)
        )

    def _container(self) -> list[psutil.Process]:
        """Every process the hub started, however far down: JupyterHub starts its managed services in
        sessions of their own (a process group would miss them), a container's PID namespace does not."""
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill_9(self) -> None:
        """The hub's container dies: every process in it is killed (its managed services too, as in a pod)."""
        assert self.process is not None
        inside = self._container()
        self.process.kill()
        _kill_all(inside)
        self.process.wait()

    def wait_healthy(self, timeout_s: float = 120) -> None:
        assert self.process is not None
        _wait_http(f"{self.hub.url}/hub/health", self.process, self.root / "hub.log", timeout_s=timeout_s)

    def stop(self) -> None:
        """The container stopped: SIGTERM to the hub, then whatever is left in it killed, as a pod's end does."""
        if self.process is not None and self.process.poll() is None:
            inside = self._container()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            _kill_all(inside)


def _kill_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=10)


def running_hub(
    tmp_path: Path, nodes: list[dict[str, Any]], env: dict[str, str] | None = None
) -> Iterator[RestartableHub]:
    """A hub (with ``env`` added) on the API double with ``nodes``; both stopped afterwards."""
    apiserver, api_port = start_api_double(tmp_path, nodes)
    hub = RestartableHub(tmp_path, api_port)
    hub.env.update(env or {})
    try:
        hub.start()
        hub.wait_healthy()
        yield hub
    finally:
        hub.stop()
        apiserver.send_signal(signal.SIGTERM)
        try:
            apiserver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            apiserver.kill()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[RestartableHub]:
    yield from running_hub(tmp_path, [gpushare_node("gpu-a", 1, 15), gpushare_node("gpu-b", 1, 15)])


def server_process(pods: Path, pod: str) -> int:
    """The pid of the double's container for ``pod`` (its working folder is pods/<pod>)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(pods / pod):
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no process runs in {pods / pod}")


def test_a_pod_that_dies_after_the_first_poll_does_not_stay_pending(restartable: RestartableHub) -> None:
    kube = restartable.hub
    assert kube.api("POST", "/users", json={"usernames": ["ria"]}).status_code == 201
    assert kube.api("POST", "/users/ria/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube.wait_ready("ria")
    pid = server_process(restartable.root / "pods", "jupyter-ria")

    restartable.stop()
    os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing: like a server still starting
    assert kube.k8s_post("/_test/faults", {**REFLECTOR_LIST, "status": "slow", "delay_s": 0, "times": 1}).ok
    restartable.start()
    deadline = time.monotonic() + 90
    while requests.get(f"{kube.api_url}/_test/faults", timeout=10).json()[-1]["times"] > 0:
        assert time.monotonic() < deadline, "the restarted hub never listed the pods"
        time.sleep(0.2)
    time.sleep(2.0)  # the hub's first poll found the pod running
    os.kill(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGCONT)
    killed = time.monotonic()

    restartable.wait_healthy()
    while kube.api("GET", "/users/ria").json()["servers"].get(""):
        assert time.monotonic() - killed < 60, "the dead server stayed pending (JupyterHub's http_timeout is 60 s)"
        time.sleep(0.5)
    gone_after = time.monotonic() - killed
    assert gone_after < 30, f"the dead server was noticed only after {gone_after:.0f} s"
