"""On Kubernetes the portal reads and changes the GPU line through the hub (hub/line_api.py).

The hub double answers as that handler does (its JSON from spawner/line_admin.py's rows,
JupyterHub's {"status", "message"} for errors); tests/kube/test_kube_line.py runs the handler
itself in a real JupyterHub.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import streamlit as st

from portal import sources
from portal.data import hub
from portal.data.errors import SourceUnavailableError
from portal.identity import Identity
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
    """The portal in the chart: every reader's requests go to the hub with their own token."""
    st.cache_data.clear()
    sessions: dict[str, LineHub] = {}

    def acting_client(identity: Identity) -> hub.HubClient:
        return hub.HubClient(API, identity.hub_token, session=sessions[identity.hub_token])

    monkeypatch.setattr(sources, "_kubernetes", lambda: True)
    monkeypatch.setattr(sources, "acting_client", acting_client)
    return sessions


TEACHER = Identity("tina", hub_token="tina-token")


def test_the_queue_waits_and_reservations_come_from_the_hub_with_the_readers_token(on_kube: dict[str, LineHub]) -> None:
    on_kube["tina-token"] = LineHub()
    assert sources.waiting_line(TEACHER) == LINE
    assert sources.wait_times(TEACHER) == WAITS
    assert sources.reservations(TEACHER) == BOOKED
    sent = on_kube["tina-token"].sent
    assert on_kube["tina-token"].headers["Authorization"] == "token tina-token"
    assert len(sent) == 1  # one answer from the hub serves the three
    method, path, _ = sent[0]
    assert method == "GET" and path == f"{hub.LINE_PATH}?since={sources._wait_since():.0f}"


def test_changes_go_to_the_hub_as_actions(on_kube: dict[str, LineHub]) -> None:
    on_kube["tina-token"] = LineHub()
    assert sources.put_first(TEACHER, "bo", "")
    assert sources.cancel_waiting(TEACHER, "bo", "gpu")
    assert sources.reserve(TEACHER, "ml101", 8 * GiB, 10.0, 20.0) == 5
    assert sources.drop_reservation(TEACHER, 4)
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
        sources.put_first(student, "al", "")
    with pytest.raises(SourceUnavailableError, match=f"The GPU line: HTTP 403, {why}"):
        sources.waiting_line(student)
    on_kube["bo-token"] = LineHub(status=400, refusal="the window must end after it starts")
    with pytest.raises(ValueError, match="the window must end after it starts"):  # the reserve form shows it
        sources.reserve(student, "ml101", GiB, 20.0, 10.0)


def test_a_hub_without_the_api_or_not_answering_is_said_so(on_kube: dict[str, LineHub]) -> None:
    on_kube["tina-token"] = LineHub(status=404, refusal="Not Found")
    with pytest.raises(SourceUnavailableError, match=r"the hub serves no GPU line API .*configure_hub"):
        sources.waiting_line(TEACHER)
    on_kube["tina-token"] = LineHub(status=503)
    with pytest.raises(SourceUnavailableError, match="JupyterHub answered HTTP 503"):
        sources.cancel_waiting(TEACHER, "bo", "")


def test_rows_from_another_version_of_the_hub_are_refused_with_a_reason() -> None:
    assert line_admin.from_json(Waiting, line_admin.to_json(LINE)) == LINE
    with pytest.raises(ValueError, match="same gpuslice version"):
        line_admin.from_json(Waiting, [{**line_admin.to_json(LINE)[0], "colour": "red"}])
    with pytest.raises(ValueError, match="missing"):
        line_admin.from_json(Reservation, [{"group": "ml101"}])


def test_on_one_machine_the_queue_is_the_ledgers_with_the_hubs_estimated_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The ledger says who waits (the hub down or not); the hub, running the waiting spawns, when each starts."""
    from spawner.ledger import Ledger
    from spawner.placement import Demand
    from spawner.waitline import Entry

    st.cache_data.clear()
    path = tmp_path / "ledger.sqlite"
    entry = Entry("bo/", "bo", Demand(slice_units=float(4 * GiB)), 4 * GiB, "ml101", 1000.0, seen=1000.0)
    Ledger(path).take_turn("bo/", lambda holds, line, mine, reservations: (None, entry))
    sessions = {"tina-token": LineHub()}
    monkeypatch.setattr(sources, "_kubernetes", lambda: False)
    monkeypatch.setattr(sources, "_ledger_path", lambda: path)
    monkeypatch.setattr(sources, "scope", lambda identity: sources.Scope("tina", everyone=True))

    def acting_client(identity: Identity) -> hub.HubClient:
        return hub.HubClient(API, identity.hub_token, session=sessions[identity.hub_token])

    monkeypatch.setattr(sources, "acting_client", acting_client)
    [bo] = sources.waiting_line(TEACHER)
    assert (bo.user, bo.since, bo.estimated_start) == ("bo", 1000.0, 1900.0)  # the hub's, for bo's waiting spawn

    st.cache_data.clear()
    sessions["tina-token"] = LineHub(status=503)
    [bo] = sources.waiting_line(TEACHER)
    assert (bo.user, bo.estimated_start) == ("bo", None)  # still listed: the start is unknown
