"""Who stopped a notebook pod, as Kubernetes Events (spawner/stop_events.py), from literal events."""

from datetime import UTC, datetime

from spawner.ledger import stop_message
from spawner.stop_events import STOP_REQUESTED, STOPPED, pod_event, stop_request, stopped_servers, timestamp

POD = {
    "metadata": {
        "name": "jupyter-ann",
        "namespace": "jhub",
        "uid": "5b1c",
        "annotations": {"hub.jupyter.org/username": "ann", "hub.jupyter.org/servername": "", "other": "x"},
    }
}
T0 = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)


def test_an_event_names_the_pod_and_carries_its_server() -> None:
    event = pod_event(POD, STOPPED, "stopped by tina in the portal", "gpuslice-hub", T0)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "jupyter-ann",
        "namespace": "jhub",
        "uid": "5b1c",
    }
    assert event["metadata"]["namespace"] == "jhub" and event["metadata"]["name"].startswith("jupyter-ann.")
    assert event["metadata"]["annotations"] == {"hub.jupyter.org/username": "ann", "hub.jupyter.org/servername": ""}
    assert (event["reason"], event["lastTimestamp"]) == (STOPPED, "2026-11-23T10:00:00Z")
    assert "eventTime" not in event  # with eventTime the API server also demands the reporting fields
    assert timestamp(event) == T0.timestamp()
    assert pod_event(POD, STOPPED, "", "c", T0)["metadata"]["name"] != event["metadata"]["name"]  # unique


def test_the_latest_recent_request_to_stop_the_pod_is_who_asked() -> None:
    older = pod_event(POD, STOP_REQUESTED, "bob in the portal", "gpuslice-portal", T0)
    newer = pod_event(POD, STOP_REQUESTED, "tina in the portal", "gpuslice-portal", T0.replace(second=30))
    other_pod = pod_event({"metadata": {**POD["metadata"], "name": "jupyter-bo"}}, STOP_REQUESTED, "eve", "p", T0)
    now = T0.timestamp() + 40
    asked = stop_request([newer, older, other_pod], "jupyter-ann", now)
    assert asked is not None and (asked.key, asked.kind, asked.message) == ("ann/", "stopping", "tina in the portal")
    assert stop_message(asked, now) == "stopped by tina in the portal"
    assert stop_request([newer], "jupyter-ann", now + 3600) is None  # an old note is not why it stops now
    assert stop_request([other_pod], "jupyter-ann", now) is None


def test_each_servers_latest_stop_by_key() -> None:
    first = pod_event(POD, STOPPED, "stopped by the idle culler: no activity for 61 min", "h", T0)
    later = pod_event(POD, STOPPED, "stopped by tina in the portal", "h", T0.replace(minute=5))
    asked = pod_event(POD, STOP_REQUESTED, "tina in the portal", "p", T0.replace(minute=5))
    unnamed = {**later, "metadata": {"name": "x", "namespace": "jhub"}}  # someone else's event: no server on it
    found = stopped_servers([later, first, asked, unnamed])
    assert list(found) == ["ann/"]
    assert (found["ann/"].kind, found["ann/"].message) == ("stopped", "stopped by tina in the portal")
