"""Faults in the Kubernetes API double: errors, evictions; the spawner retries or fails clearly and holds nothing."""

import time

from tests.kube.conftest import KubeHub


def _pods(kube_hub: KubeHub) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube_hub.k8s("/api/v1/namespaces/gpuslice/pods")["items"])


def test_a_failing_pod_create_is_retried(kube_hub: KubeHub) -> None:
    fault = {"method": "POST", "path_contains": "/namespaces/gpuslice/pods", "status": 500, "times": 1}
    assert kube_hub.k8s_post("/_test/faults", fault).status_code == 200
    assert kube_hub.api("POST", "/users", json={"usernames": ["eve"]}).status_code == 201
    assert kube_hub.api("POST", "/users/eve/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("eve")
    assert _pods(kube_hub) == ["jupyter-eve"]


def test_a_pod_create_that_keeps_failing_fails_the_spawn_and_leaves_nothing(kube_hub: KubeHub) -> None:
    fault = {"method": "POST", "path_contains": "/namespaces/gpuslice/pods", "status": 500, "times": 1000}
    assert kube_hub.k8s_post("/_test/faults", fault).status_code == 200
    assert kube_hub.api("POST", "/users", json={"usernames": ["fay"]}).status_code == 201
    kube_hub.api("POST", "/users/fay/server", json={"gpu_memory": "2GiB"})
    deadline = time.monotonic() + 90
    while True:
        server = kube_hub.api("GET", "/users/fay").json()["servers"].get("")
        if not server or not server.get("pending"):
            break
        assert time.monotonic() < deadline, "the spawn neither failed nor started"
        time.sleep(1)
    assert not server or not server.get("ready")
    assert _pods(kube_hub) == []  # nothing holds a GPU


def test_an_evicted_pod_ends_the_server_and_its_slice(kube_hub: KubeHub) -> None:
    assert kube_hub.api("POST", "/users", json={"usernames": ["gus"]}).status_code == 201
    assert kube_hub.api("POST", "/users/gus/server", json={"gpu_memory": "15GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("gus")
    assert kube_hub.k8s_post("/_test/evict/gpuslice/jupyter-gus", {}).status_code == 200
    deadline = time.monotonic() + 60
    while kube_hub.api("GET", "/users/gus").json()["servers"].get(""):
        assert time.monotonic() < deadline, "the hub did not notice the eviction"
        time.sleep(1)
    # The card is free again: a new 15 GiB server fits on gpu-a or gpu-b.
    assert kube_hub.api("POST", "/users/gus/server", json={"gpu_memory": "15GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("gus")


def test_watch_errors_fail_clearly_then_a_retry_and_a_hung_create_work(kube_hub: KubeHub) -> None:
    # A 500 on the events list as KubeSpawner starts watching. (A 410 on the pods list at that
    # moment can leave KubeSpawner's stop waiting on a dead pod reflector: known, see docs/load.md.)
    fault = {"method": "GET", "path_contains": "/namespaces/gpuslice/events", "status": 500, "times": 1}
    assert kube_hub.k8s_post("/_test/faults", fault).status_code == 200
    assert kube_hub.api("POST", "/users", json={"usernames": ["hal"]}).status_code == 201
    failed = kube_hub.api("POST", "/users/hal/server", json={"gpu_memory": "2GiB"})
    assert failed.status_code == 503, failed.text
    assert "The Kubernetes API answered HTTP" in failed.json()["message"]
    assert "no GPU is held" in failed.json()["message"] and _pods(kube_hub) == []

    # The user presses Start again; this time the create hangs once past its timeout and is retried.
    hang = {"method": "POST", "path_contains": "/namespaces/gpuslice/pods", "status": "timeout", "times": 1}
    assert kube_hub.k8s_post("/_test/faults", hang).status_code == 200
    assert kube_hub.api("POST", "/users/hal/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("hal", timeout_s=120)
    assert _pods(kube_hub) == ["jupyter-hal"]  # one pod, not one per attempt
