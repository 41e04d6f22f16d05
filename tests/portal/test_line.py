"""The portal reads and changes the GPU line through the hub (hub/line_api.py), on both backends.

The hub double answers as that handler does (its JSON from spawner/line_admin.py's rows,
JupyterHub's {"status", "message"} for errors); tests/kube/test_kube_line.py runs the handler
itself in a real JupyterHub, tests/portal/line_hub.py over a ledger for the pages' tests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import streamlit as st

from portal.data import hub
from portal.data.access import Scope
from portal.data.errors import SourceUnavailableError
from portal.identity import Identity
from portal.sources import classes, clients, line
from spawner import line_admin
from spawner.line_admin import Waiting
from spawner.waitline import Reservation, WaitStats

GiB = 2**30
LINE = [Waiting(1, "bo", "", "4 GiB of one GPU", "ml101", 1000.0, False, estimated_start=1900.0)]
WAITS = [WaitStats("2026-11-23", "ml101", 3, 2, 60.0, 300.0, 300.0)]
BOOKED = [Reservation("ml101", 8 * GiB, 0.0, 9e9, "tina", id=4)]


class LineHub(requests.Session):
    """The hub's line API as one reader's session reaches it: its answers, and what it was sent."""

    def __init__(self, status: int = 200, refusal: str = "") -> None:
        super().__init__()
        self.status, self.refusal = status, refusal
        self.sent: list[tuple[str, str, Any]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        method, url = str(method), str(url)
        self.sent.append((method, url.removeprefix(API), kwargs.get("json")))
        assert url.startswith(f"{API}{hub.LINE_PATH}"), url
        if self.status != 200:
            body: Any = {"status": self.status, "message": self.refusal}
        elif method == "GET":
            body = {
                "line": line_admin.to_json(LINE),
                "waits": line_admin.to_json(WAITS),
                "reservations": line_admin.to_json(BOOKED),
            }
        else:
            body = {"id": 5} if kwargs["json"]["action"] == "reserve" else {"done": True}
        response = requests.Response()
        response.status_code = self.status
        response._content = json.dumps(body).encode()
        return response


API = "http://hub.invalid/hub/api"


@pytest.fixture
def on_kube(monkeypatch: pytest.MonkeyPatch) -> dict[str, LineHub]:
    """The portal's requests to the hub: its own token ("portal") and each reader's own."""
    st.cache_data.clear()
    st.cache_resource.clear()  # the shared snapshots (portal/sources/snapshot.py)
    sessions: dict[str, LineHub] = {"portal": LineHub()}

    def acting_client(identity: Identity) -> hub.HubClient:
        return hub.HubClient(API, identity.hub_token, session=sessions[identity.hub_token])

    monkeypatch.setattr(clients, "acting_client", acting_client)
    monkeypatch.setattr(clients, "hub_client", lambda: hub.HubClient(API, "portal", session=sessions["portal"]))
    monkeypatch.setattr(classes, "scope", lambda identity: Scope(identity.name, everyone=True))
    return sessions


TEACHER = Identity("tina", hub_token="tina-token")


def test_the_queue_and_reservations_are_one_snapshot_from_the_hub_the_waits_the_readers_own(
    on_kube: dict[str, LineHub],
) -> None:
    on_kube["tina-token"] = LineHub()
    assert line.waiting_line(TEACHER) == LINE
    assert line.reservations(TEACHER) == BOOKED
    assert line.wait_times(TEACHER) == WAITS
    assert on_kube["portal"].headers["Authorization"] == "token portal"
    assert [method for method, _, _ in on_kube["portal"].sent] == ["GET"]  # one answer serves the line and bookings
    assert on_kube["tina-token"].headers["Authorization"] == "token tina-token"
    [(method, path, _)] = on_kube["tina-token"].sent  # the waits she may see: the hub narrows them to her
    assert method == "GET" and path == f"{hub.LINE_PATH}?since={line._wait_since():.0f}"


def test_each_reader_sees_the_places_of_their_scope_only(
    on_kube: dict[str, LineHub], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(classes, "scope", lambda identity: Scope(identity.name))
    assert line.waiting_line(Identity("bo")) == LINE  # his own place
    assert line.waiting_line(Identity("al")) == []  # not bo's


def test_changes_go_to_the_hub_as_actions(on_kube: dict[str, LineHub]) -> None:
    on_kube["tina-token"] = LineHub()
    assert line.put_first(TEACHER, "bo", "")
    assert line.cancel_waiting(TEACHER, "bo", "gpu")
    assert line.reserve(TEACHER, "ml101", 8 * GiB, 10.0, 20.0) == 5
    assert line.drop_reservation(TEACHER, 4)
    assert [body for _, _, body in on_kube["tina-token"].sent] == [
        {"action": "put-first", "user": "bo", "server": ""},
        {"action": "cancel", "user": "bo", "server": "gpu"},
        {"action": "reserve", "group": "ml101", "memory_bytes": 8 * GiB, "start": 10.0, "end": 20.0},
        {"action": "drop-reservation", "id": 4},
    ]


def test_a_refusal_says_the_hubs_words(on_kube: dict[str, LineHub]) -> None:
    why = "bo may not change the GPU line: only admins and the teachers of a class can"
    student = Identity("bo", hub_token="bo-token")
    on_kube["bo-token"] = LineHub(status=403, refusal=why)
    with pytest.raises(PermissionError, match=f"The hub refused: {why}"):
        line.put_first(student, "al", "")
    with pytest.raises(SourceUnavailableError, match=f"The GPU line: HTTP 403, {why}"):
        line.wait_times(student)
    on_kube["bo-token"] = LineHub(status=400, refusal="the window must end after it starts")
    with pytest.raises(ValueError, match="the window must end after it starts"):  # the reserve form shows it
        line.reserve(student, "ml101", GiB, 20.0, 10.0)


def test_a_hub_without_the_api_or_not_answering_is_said_so(on_kube: dict[str, LineHub]) -> None:
    on_kube["portal"] = LineHub(status=404, refusal="Not Found")
    with pytest.raises(SourceUnavailableError, match=r"the hub serves no GPU line API .*configure_hub"):
        line.waiting_line(TEACHER)
    on_kube["tina-token"] = LineHub(status=503)
    with pytest.raises(SourceUnavailableError, match="JupyterHub answered HTTP 503"):
        line.cancel_waiting(TEACHER, "bo", "")


def test_rows_from_another_version_of_the_hub_are_refused_with_a_reason() -> None:
    assert line_admin.from_json(Waiting, line_admin.to_json(LINE)) == LINE
    with pytest.raises(ValueError, match="same gpuslice version"):
        line_admin.from_json(Waiting, [{**line_admin.to_json(LINE)[0], "colour": "red"}])
    with pytest.raises(ValueError, match="missing"):
        line_admin.from_json(Reservation, [{"group": "ml101"}])


def test_on_one_machine_the_queue_is_the_hubs_too_with_its_estimated_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """No backend reads the line's file from the portal: the hub, running the waiting spawns, says who
    waits and when each starts; a hub that does not answer is said so (the servers need it too)."""
    from hub.settings import Settings
    from portal.data.deployment import OneMachine

    st.cache_data.clear()
    st.cache_resource.clear()  # the shared snapshots (portal/sources/snapshot.py)
    monkeypatch.setattr(clients, "deployment", lambda: OneMachine(Settings(data_dir=tmp_path)))
    sessions = {"portal": LineHub()}
    monkeypatch.setattr(clients, "hub_client", lambda: hub.HubClient(API, "portal", session=sessions["portal"]))
    monkeypatch.setattr(classes, "scope", lambda identity: Scope("tina", everyone=True))
    [bo] = line.waiting_line(TEACHER)
    assert (bo.user, bo.since, bo.estimated_start) == ("bo", 1000.0, 1900.0)  # the hub's, for bo's waiting spawn
    assert not (tmp_path / "ledger.sqlite").exists()  # never opened here

    st.cache_data.clear()
    st.cache_resource.clear()  # the shared snapshots (portal/sources/snapshot.py)
    sessions["portal"] = LineHub(status=503)
    with pytest.raises(SourceUnavailableError, match="JupyterHub answered HTTP 503"):
        line.waiting_line(TEACHER)
