"""Faults in the Kubernetes API double: errors, evictions; the spawner retries or fails clearly and holds nothing."""

import time

import pytest

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


@pytest.mark.waits
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


def _refused_for_api_error(kube_hub: KubeHub, user: str) -> None:
    failed = kube_hub.api("POST", f"/users/{user}/server", json={"gpu_memory": "2GiB"})
    assert failed.status_code == 503, failed.text
    assert "The Kubernetes API answered HTTP 500" in failed.json()["message"]
    assert "no GPU is held" in failed.json()["message"] and _pods(kube_hub) == []


def _wait_stopped(kube_hub: KubeHub, user: str, timeout_s: float = 30) -> None:
    """The hub's clean-up after a failed start ends (a stop that hangs keeps the server pending)."""
    deadline = time.monotonic() + timeout_s
    while kube_hub.api("GET", f"/users/{user}").json()["servers"].get(""):
        assert time.monotonic() < deadline, f"{user}'s failed server was not cleaned up in {timeout_s}s"
        time.sleep(0.5)


# KubeSpawner's pod reflector lists with this selector; gpuslice's own inventory lists without it.
REFLECTOR_PODS = {"method": "GET", "path_contains": "/namespaces/gpuslice/pods", "query_contains": "labelSelector"}


@pytest.mark.waits
def test_an_events_list_error_while_the_pods_list_is_slow_fails_clearly_and_the_hub_recovers(
    kube_hub: KubeHub,
) -> None:
    # The first Start lists pods and events together; the events list fails while the pods list is
    # still on its way. That once left the hub's shared pod reflector half-started, and the clean-up
    # stop of the failed server, and every spawn after it, waited on it for ever.
    slow = {**REFLECTOR_PODS, "status": "slow", "delay_s": 3, "times": 1}
    error = {"method": "GET", "path_contains": "/namespaces/gpuslice/events", "status": 500, "times": 1}
    for fault in (slow, error):
        assert kube_hub.k8s_post("/_test/faults", fault).status_code == 200
    assert kube_hub.api("POST", "/users", json={"usernames": ["hal"]}).status_code == 201
    _refused_for_api_error(kube_hub, "hal")
    _wait_stopped(kube_hub, "hal")

    # The user presses Start again; this time the create hangs once past its timeout and is retried.
    hang = {"method": "POST", "path_contains": "/namespaces/gpuslice/pods", "status": "timeout", "times": 1}
    assert kube_hub.k8s_post("/_test/faults", hang).status_code == 200
    assert kube_hub.api("POST", "/users/hal/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("hal", timeout_s=120)
    assert _pods(kube_hub) == ["jupyter-hal"]  # one pod, not one per attempt
    # The events reflector that failed its first list was started afresh: a pod the scheduler
    # cannot place gets its FailedScheduling event explained in the progress.
    kube_hub.hold_every_card_outside_the_hub(gib=13)
    assert kube_hub.api("POST", "/users", json={"usernames": ["ivy"]}).status_code == 201
    assert kube_hub.api("POST", "/users/ivy/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    assert "Insufficient aliyun.com/gpu-mem" in kube_hub.progress_until("ivy", "Waiting for a GPU")[-1]


@pytest.mark.waits
def test_a_pods_list_error_fails_clearly_and_the_next_start_and_stop_work(kube_hub: KubeHub) -> None:
    fault = {**REFLECTOR_PODS, "status": 500, "times": 1}
    assert kube_hub.k8s_post("/_test/faults", fault).status_code == 200
    assert kube_hub.api("POST", "/users", json={"usernames": ["ida"]}).status_code == 201
    _refused_for_api_error(kube_hub, "ida")
    _wait_stopped(kube_hub, "ida")
    assert kube_hub.api("POST", "/users/ida/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("ida")
    assert kube_hub.api("DELETE", "/users/ida/server").status_code in (202, 204)
    _wait_stopped(kube_hub, "ida")
    assert _pods(kube_hub) == []


def test_a_410_gone_on_the_pods_watch_is_survived(kube_hub: KubeHub) -> None:
    # The API server compacted its history: the watch answers with a 410 ERROR event. KubeSpawner's
    # pod reflector must list again and go on watching, or stops and readiness are never seen.
    assert kube_hub.api("POST", "/users", json={"usernames": ["jo"]}).status_code == 201
    assert kube_hub.api("POST", "/users/jo/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("jo")
    gone = {**REFLECTOR_PODS, "query_contains": "watch", "status": "gone", "times": 1}
    assert kube_hub.k8s_post("/_test/faults", gone).status_code == 200
    deadline = time.monotonic() + 30  # the reflector re-watches at least every 10 s
    while [f for f in kube_hub.k8s("/_test/faults") if f["status"] == "gone" and f["times"]]:
        assert time.monotonic() < deadline, "the pod reflector never watched again"
        time.sleep(0.5)
    # The reflector still follows the pods: a stop is seen, and a new server becomes ready.
    assert kube_hub.api("DELETE", "/users/jo/server").status_code in (202, 204)
    _wait_stopped(kube_hub, "jo")
    assert kube_hub.api("POST", "/users/jo/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("jo")
    assert _pods(kube_hub) == ["jupyter-jo"]


def test_a_pod_left_from_before_is_replaced_on_409(kube_hub: KubeHub) -> None:
    # A pod of the same name survives from an earlier hub (a 409 AlreadyExists on create):
    # KubeSpawner deletes it and creates the user's pod, with the GPU resources of this request.
    leftover = {
        "metadata": {"name": "jupyter-kim", "labels": {"component": "singleuser-server"}},
        "spec": {"containers": [{"name": "notebook", "image": "old", "command": ["sleep", "3600"]}]},
    }
    assert kube_hub.k8s_post("/api/v1/namespaces/gpuslice/pods", leftover).status_code == 201
    assert kube_hub.api("POST", "/users", json={"usernames": ["kim"]}).status_code == 201
    assert kube_hub.api("POST", "/users/kim/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    kube_hub.wait_ready("kim", timeout_s=120)
    pod = kube_hub.k8s("/api/v1/namespaces/gpuslice/pods/jupyter-kim")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
    assert _pods(kube_hub) == ["jupyter-kim"]
