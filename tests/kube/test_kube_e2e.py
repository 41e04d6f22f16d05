"""End to end: a real JupyterHub spawns through KubeGpuSpawner into the Kubernetes API double."""

import time
from datetime import UTC, datetime

import pytest
import requests

from portal.data.access import Scope
from portal.data.cluster import KubeClient, kube_server_events, note_kube_stop
from tests.kube.conftest import KubeHub


def test_spawn_reach_refuse_and_stop(kube_hub: KubeHub) -> None:
    assert kube_hub.api("POST", "/users", json={"usernames": ["ann", "bob", "cy"]}).status_code == 201
    assert kube_hub.api("POST", "/users/ann/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("ann")

    pod = kube_hub.k8s("/api/v1/namespaces/gpuslice/pods/jupyter-ann")
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
    assert pod["metadata"]["annotations"]["gpuslice.io/sharing-backend"] == "gpushare"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * 2**30)
    assert container["image"] == "ghcr.io/gpuslice/notebook-base:1.0"

    # Through the proxy to the server the fake kubelet runs at the pod's IP.
    api = requests.get(
        f"{kube_hub.url}/user/ann/api/status", headers={"Authorization": f"token {kube_hub.token}"}, timeout=30
    )
    assert api.status_code == 200, api.text

    assert kube_hub.api("POST", "/users/bob/server", json={"gpu_memory": "12GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("bob")
    refused = kube_hub.api("POST", "/users/cy/server", json={"gpu_memory": "12GiB"})
    assert refused.status_code == 409, refused.text
    message = refused.json()["message"]
    assert "Nothing can hold 12 GiB of one GPU right now." in message
    assert "The largest free slice is 11 GiB on gpu-a GPU 0" in message
    pods = kube_hub.k8s("/api/v1/namespaces/gpuslice/pods")["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["jupyter-ann", "jupyter-bob"]  # nothing created for cy

    assert kube_hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    deadline = time.monotonic() + 60
    while any(
        p["metadata"]["name"] == "jupyter-ann" for p in kube_hub.k8s("/api/v1/namespaces/gpuslice/pods")["items"]
    ):
        assert time.monotonic() < deadline, "ann's pod was not deleted"
        time.sleep(0.5)


@pytest.mark.waits
def test_a_pod_the_scheduler_cannot_place_is_explained_in_the_progress(kube_hub: KubeHub) -> None:
    # Someone outside the hub's namespace holds every card: the hub's own view (its
    # namespace) says there is room, the scheduler says there is not.
    kube_hub.hold_every_card_outside_the_hub()
    assert kube_hub.api("POST", "/users", json={"usernames": ["dee"]}).status_code == 201
    assert kube_hub.api("POST", "/users/dee/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)

    messages = kube_hub.progress_until("dee", "Waiting for a GPU")
    waiting = messages[-1]
    assert "Waiting for a GPU: the hub's namespace leaves room for 2 GiB of one GPU, but workloads outside" in waiting
    assert "0/2 nodes are available: 2 Insufficient aliyun.com/gpu-mem" in waiting
    assert kube_hub.api("DELETE", "/users/dee/server").status_code in (202, 204)


def _stops(kube_hub: KubeHub) -> dict[str, str]:
    events = kube_server_events(KubeClient(kube_hub.api_url, ""), "gpuslice")
    return {key: e.message for key, e in events.items() if e.kind == "stopped"}


def test_who_stopped_a_server_outlives_its_pod(kube_hub: KubeHub) -> None:
    assert kube_hub.api("POST", "/users", json={"usernames": ["ann", "bob"]}).status_code == 201
    for user in ("ann", "bob"):
        assert kube_hub.api("POST", f"/users/{user}/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
        kube_hub.wait_ready(user)
    # The portal notes who asks, then asks the hub; bob's server is stopped through the hub's API alone.
    client = KubeClient(kube_hub.api_url, "")
    with pytest.raises(PermissionError):
        note_kube_stop(client, "gpuslice", Scope("bob"), "ann", "", datetime.now(UTC))
    note_kube_stop(client, "gpuslice", Scope("tina", everyone=True), "ann", "", datetime.now(UTC))
    for user in ("ann", "bob"):
        assert kube_hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    deadline = time.monotonic() + 60
    while kube_hub.k8s("/api/v1/namespaces/gpuslice/pods?labelSelector=component%3Dsingleuser-server")["items"]:
        assert time.monotonic() < deadline, "the pods were not deleted"
        time.sleep(0.5)
    stops = _stops(kube_hub)  # the pods are gone: only the events say what happened
    assert stops["ann/"] == "stopped by tina in the portal"
    assert stops["bob/"].startswith("stopped from the hub")

    time.sleep(1.1)  # event times have whole seconds: the new pod is made after the stop
    assert kube_hub.api("POST", "/users/ann/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("ann")
    assert "ann/" not in _stops(kube_hub)  # running again: the old stop is not its state
