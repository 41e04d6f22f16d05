"""The recorder's webhook over real HTTP (tornado, in this process): the token, the body, the store."""

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer

from portal.data.incident_store import IncidentStore
from portal.recorder import WEBHOOK_PATH, make_app
from spawner.ports import free_port
from tests.portal.test_incident_store import webhook, xid

pytestmark = pytest.mark.process  # a real HTTP server on a loopback port
TOKEN = "t0ken-from-a-0600-file"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    yield IncidentStore(tmp_path / "incidents.sqlite")


def post(store: IncidentStore, body: Any, headers: dict[str, str]) -> int:
    """POST one body to a recorder serving ``store``; the HTTP status."""

    async def go() -> int:
        port = free_port()
        server = HTTPServer(make_app(store, TOKEN))
        server.listen(port, "127.0.0.1")
        try:
            response = await AsyncHTTPClient().fetch(
                f"http://127.0.0.1:{port}{WEBHOOK_PATH}",
                method="POST",
                body=json.dumps(body) if not isinstance(body, bytes) else body,
                headers=headers,
            )
            return response.code
        except HTTPClientError as exc:
            return exc.code
        finally:
            server.stop()

    return asyncio.run(go())


def test_a_notification_with_the_token_is_recorded(store: IncidentStore) -> None:
    assert post(store, webhook("first-line-alice", xid()), {"Authorization": f"Bearer {TOKEN}"}) == 204
    [kept] = store.incidents()
    assert kept.incident.title == "GpuXidError on node n1, gpu 0"
    assert [n.receiver for n in kept.notifications] == ["first-line-alice"]
    assert kept.notifications[0].at <= datetime.now(UTC)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}],
)
def test_without_the_token_nothing_is_written(store: IncidentStore, headers: dict[str, str]) -> None:
    assert post(store, webhook("first-line-alice", xid()), headers) == 401
    assert store.incidents() == []


def test_a_body_that_is_not_a_notification_is_refused(store: IncidentStore) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post(store, b"{not json", auth) == 400
    assert post(store, {"version": "4", "alerts": [{"labels": {}}]}, auth) == 400
    assert store.incidents() == []


def test_the_recorder_never_runs_without_a_token(store: IncidentStore) -> None:
    with pytest.raises(ValueError, match="never an unauthenticated webhook"):
        make_app(store, "")
