"""A 4 GiB notebook through DRA (a shared card) and through KAI Scheduler (a fraction), on the API double.

A real JupyterHub with KubeGpuSpawner spawns against the double, which allocates the claim as
kube-scheduler's DRA plugin does (tests/kube/dra.py) or places the fraction as KAI does
(tests/kube/kai.py); the portal's data layer then shows the server on the GPUs page with its owner,
and a second 4 GiB notebook that no card can hold is refused with the reason. The objects are the
fixtures of tests/spawner/sharing/fixtures (dra_cluster.yaml, kai_cluster.yaml cite their sources).
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from portal.data.cluster import KubeClient, kube_inventory
from portal.views import gpu_rows
from spawner import sharing
from tests.e2e.platform import free_port
from tests.kube.conftest import HERE, KubeHub, _wait_http, start_api_double, write_kubeconfig

FIXTURES = HERE.parent / "spawner" / "sharing" / "fixtures"
GiB = 2**30


def fixture(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load((FIXTURES / name).read_text())["items"]
    return items


def dra_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """gpu-a with one GPU of 6 GiB that claims may share (the fixture's first, smaller), the driver's classes."""
    items = fixture("dra_cluster.yaml")
    nodes = [i for i in items if i["kind"] == "Node"]
    resource_slice = copy.deepcopy(next(i for i in items if i["kind"] == "ResourceSlice"))
    resource_slice["spec"]["devices"] = resource_slice["spec"]["devices"][:1]
    resource_slice["spec"]["devices"][0]["capacity"]["memory"]["value"] = "6Gi"
    return nodes, [*(i for i in items if i["kind"] == "DeviceClass"), resource_slice]


def kai_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """gpu-k with one card of 6 GiB, and KAI's default queues plus one for the class ml101."""
    node = copy.deepcopy(next(i for i in fixture("kai_cluster.yaml") if i["kind"] == "Node"))
    node["metadata"]["labels"].update({"nvidia.com/gpu.memory": "6144", "nvidia.com/gpu.count": "1"})
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "1"
    parent = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "default-parent-queue"}}
    leaves = [
        {**parent, "metadata": {"name": name}, "spec": {"parentQueue": "default-parent-queue"}}
        for name in ("default-queue", "ml101")
    ]
    return [node], [{**parent, "spec": {}}, *leaves]


def created(api: str, obj: dict[str, Any]) -> None:
    plural = {"DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices", "Queue": "queues"}[obj["kind"]]
    response = requests.post(f"{api}/apis/{obj['apiVersion']}/{plural}", json=obj, timeout=10)
    assert response.status_code == 201, response.text


@pytest.fixture
def hub_on(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KubeHub]:
    backend = request.param
    nodes, objects = dra_cluster() if backend == "dra" else kai_cluster()
    apiserver, api_port = start_api_double(
        tmp_path, nodes, extra_args=("--schedulers", "default-scheduler,kai-scheduler")
    )
    hub = None
    try:
        for obj in objects:
            created(f"http://127.0.0.1:{api_port}", obj)
        port, token = free_port(), secrets.token_hex(16)
        write_kubeconfig(tmp_path / "kubeconfig", api_port)
        env = dict(
            os.environ,
            KUBECONFIG=str(tmp_path / "kubeconfig"),
            GPUSLICE_TEST_DIR=str(tmp_path),
            GPUSLICE_TEST_PORT=str(port),
            GPUSLICE_TEST_HUB_PORT=str(free_port()),
            GPUSLICE_TEST_PROXY_PORT=str(free_port()),
            GPUSLICE_TEST_TOKEN=token,
            GPUSLICE_TEST_BACKEND=backend,
            PYTHONPATH=str(HERE.parents[1]),
        )
        log = (tmp_path / "hub.log").open("wb")
        hub = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(HERE / "jupyterhub_config.py")],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=log,
        )
        _wait_http(f"http://127.0.0.1:{port}/hub/health", hub, tmp_path / "hub.log", timeout_s=90)
        yield KubeHub(tmp_path, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}", token)
    finally:
        for proc in (hub, apiserver):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def spawn(hub: KubeHub, user: str) -> requests.Response:
    assert hub.api("POST", f"/users/{user}").status_code in (201, 409)
    return hub.api("POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"})


def portal_rows(hub: KubeHub, backend: str) -> list[tuple[str, str]]:
    inventory, _ = kube_inventory(KubeClient(hub.api_url, token=""), "gpuslice", sharing.backend(backend))
    return [(f"{r.node}/{r.gpu}", r.holders) for r in gpu_rows(inventory, None)]


@pytest.mark.parametrize("hub_on", ["dra"], indirect=True)
def test_a_4gib_notebook_through_dra_shares_a_card_and_the_next_is_refused_with_the_reason(hub_on: KubeHub) -> None:
    hub = hub_on
    assert spawn(hub, "ann").status_code in (201, 202)
    hub.wait_ready("ann")
    template = hub.k8s("/apis/resource.k8s.io/v1/namespaces/gpuslice/resourceclaimtemplates/jupyter-ann-gpu")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "4096Mi"}}
    (claim,) = hub.k8s("/apis/resource.k8s.io/v1/namespaces/gpuslice/resourceclaims")["items"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["device"], result["consumedCapacity"]) == ("gpu-0", {"memory": str(4 * GiB)})
    assert portal_rows(hub, "dra") == [("gpu-a/0", "ann 4 GiB")]  # the GPUs page, with its owner

    refused = spawn(hub, "bob")
    assert refused.status_code >= 400, refused.text
    message = refused.json()["message"]
    assert "Nothing can hold 4 GiB of one GPU right now" in message and "largest free slice is 2 GiB" in message
    assert len(hub.k8s("/apis/resource.k8s.io/v1/namespaces/gpuslice/resourceclaims")["items"]) == 1  # nothing held

    assert hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    for _ in range(100):  # the claim goes with the pod, the template with the server
        claims = hub.k8s("/apis/resource.k8s.io/v1/namespaces/gpuslice/resourceclaims")["items"]
        templates = hub.k8s("/apis/resource.k8s.io/v1/namespaces/gpuslice/resourceclaimtemplates")["items"]
        if not claims and not templates:
            break
        time.sleep(0.2)
    assert not claims and not templates


@pytest.mark.parametrize("hub_on", ["kai"], indirect=True)
def test_a_4gib_notebook_through_kai_is_a_fraction_in_its_queue_and_the_next_is_refused(hub_on: KubeHub) -> None:
    hub = hub_on
    assert spawn(hub, "gina").status_code in (201, 202)  # gina is in ml101 (tests/kube/jupyterhub_config.py)
    hub.wait_ready("gina")
    pod = hub.k8s("/api/v1/namespaces/gpuslice/pods/jupyter-gina")
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "ml101"
    assert pod["metadata"]["annotations"]["gpu-memory"] == "4096"
    (reservation,) = hub.k8s("/api/v1/namespaces/kai-resource-reservation/pods")["items"]
    assert reservation["metadata"]["labels"]["runai-gpu-group"] == pod["metadata"]["labels"]["runai-gpu-group"]
    assert portal_rows(hub, "kai") == [("gpu-k/0", "gina 4 GiB")]  # the GPUs page, with its owner

    refused = spawn(hub, "hal")
    assert refused.status_code >= 400, refused.text
    message = refused.json()["message"]
    assert "Nothing can hold 4 GiB of one GPU right now" in message and "largest free slice is 2 GiB" in message
