"""portal/data/cluster.py against the Kubernetes API double over real HTTP."""

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from portal.data import access
from portal.data.access import Scope
from portal.data.cluster import KubeClient, kube_inventory, kube_server_events
from spawner import sharing
from tests.kube.conftest import gpushare_node, start_api_double

GiB = 2**30


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    process, port = start_api_double(tmp_path, [gpushare_node("gpu-a", 2, 16)], kubelet=False, namespaces=("jupyter",))
    yield f"http://127.0.0.1:{port}"
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def notebook(user: str, gib: int, group: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"jupyter-{user}",
            "labels": {"component": "singleuser-server", "hub.jupyter.org/username": user},
            "annotations": {
                "hub.jupyter.org/username": user,
                "hub.jupyter.org/servername": "",
                "gpuslice.io/group": group,
                "gpuslice.io/gpu-memory-bytes": str(gib * GiB),
            },
        },
        "spec": {
            "containers": [
                {"name": "notebook", "image": "nb", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}
            ]
        },
    }


@pytest.mark.process
def test_inventory_holds_and_why_pods_wait(api: str) -> None:
    for body in (notebook("ann", 4, "ml101"), notebook("bob", 40, "ml101")):
        assert requests.post(f"{api}/api/v1/namespaces/jupyter/pods", json=body, timeout=10).status_code == 201
    client = KubeClient(api, token="")

    for _ in range(50):  # the double's scheduler runs just after the create
        if len(access.events(kube_server_events(client, "jupyter"), Scope("root", everyone=True))) == 2:
            break
        time.sleep(0.1)
    inventory, holds = kube_inventory(client, "jupyter", sharing.backend("gpushare"))
    assert [(h.user, h.gpu_index, h.memory_bytes, h.group) for h in holds] == [("ann", 0, 4 * GiB, "ml101")]
    assert inventory.capacity_bytes == 32 * GiB
    events = access.events(kube_server_events(client, "jupyter"), Scope("root", everyone=True))
    # ann is scheduled and waits for her container (no kubelet here); bob cannot be placed.
    assert events["ann/"].message == "Scheduled: Successfully assigned jupyter/jupyter-ann to gpu-a"
    assert events["bob/"].message.startswith(
        "FailedScheduling: 0/1 nodes are available: 1 Insufficient aliyun.com/gpu-mem"
    )
    assert list(access.events(kube_server_events(client, "jupyter"), Scope("ann"))) == ["ann/"]  # only her own


def test_an_evicted_pod_shows_as_failed_with_the_reason() -> None:
    from portal.data.cluster import server_events_from_pods

    pod = notebook("cy", 2, "ml101")
    pod["status"] = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
    event = {
        "involvedObject": {"name": "jupyter-cy"},
        "reason": "Evicted",
        "message": "x",
        "lastTimestamp": "2026-11-22T08:00:00Z",
    }
    found = server_events_from_pods([pod], [event])
    assert found["cy/"].kind == "died" and found["cy/"].failure
    assert found["cy/"].message == "Evicted: The node was low on resource: memory."
