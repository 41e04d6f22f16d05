"""The data layer against answers recorded from JupyterHub 5, Prometheus 2.42 and Alertmanager 0.25."""

import json
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from portal.data import access, errors, hub, prometheus
from portal.data.access import Scope
from portal.data.alertmanager import Alertmanager
from portal.identity import Identity
from spawner.quotas import read_groups

ALICE = {
    "kind": "user",
    "name": "alice",
    "admin": False,
    "groups": ["ml101"],
    "server": "/user/alice/",
    "pending": None,
    "last_activity": "2026-11-22T05:20:31.000000Z",
    "servers": {
        "": {
            "name": "",
            "ready": True,
            "stopped": False,
            "pending": None,
            "url": "/user/alice/",
            "user_options": {"gpu_memory": "4GiB"},
            "progress_url": "/hub/api/users/alice/server/progress",
            "started": "2026-11-22T05:20:26.906000Z",
            "last_activity": "2026-11-22T05:20:31.000000Z",
        },
        "big": {
            "name": "big",
            "ready": False,
            "pending": "spawn",
            "url": "/user/alice/big/",
            "user_options": {"gpus": 1, "image": "torch"},
            "started": None,
            "last_activity": None,
        },
    },
}
BOB = {"kind": "user", "name": "bob", "admin": False, "groups": [], "servers": {}}


def _page(items: list[Any], offset: int, limit: int, total: int) -> dict[str, Any]:
    """JupyterHub 5's answer to a list with ``Accept: application/jupyterhub-pagination+json``."""
    following = offset + limit
    nxt = {"offset": following, "limit": limit, "url": f"/hub/api/users?offset={following}&limit={limit}"}
    pagination = {"offset": offset, "limit": limit, "total": total, "next": nxt if following < total else None}
    return {"items": items[offset:following], "_pagination": pagination}


class FakeHub(hub.HubClient):
    """Answers as JupyterHub 5 does, one user per page when asked for pages."""

    def __init__(self, users: list[dict[str, Any]] | None = None) -> None:
        super().__init__("http://hub.invalid/hub/api", "token")
        self.users = [ALICE, BOB] if users is None else users
        self.requests: list[tuple[str, str]] = []

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        self.requests.append((method, path))
        paged = (kwargs.get("headers") or {}).get("Accept") == hub.PAGINATED
        if path.startswith("/users") and method == "GET":
            offset = int(path.split("offset=")[1].split("&")[0]) if "offset=" in path else 0
            body: Any = _page(self.users, offset, 1, len(self.users)) if paged else self.users[:1]
        elif path.startswith("/groups"):
            groups = [{"kind": "group", "name": "ml101", "users": ["alice", "bob"], "roles": []}]
            body = _page(groups, 0, 200, 1) if paged else groups
        elif method == "DELETE":
            body = None
        else:
            raise AssertionError(path)
        response = requests.Response()
        response.status_code = 204 if body is None else 200
        response._content = b"" if body is None else json.dumps(body).encode()
        return response


def test_servers_from_the_user_model() -> None:
    rows = hub.servers_in_scope(hub.every_user(FakeHub()), Scope("alice"))
    default, big = rows
    assert (default.user, default.name, default.state, default.gpu_memory) == ("alice", "", "running", "4GiB")
    assert default.started is not None and default.started.year == 2026
    assert (big.state, big.gpus, big.image, big.started) == ("starting", 1, "torch", None)


def test_every_page_of_users_is_read() -> None:
    # Without following the pages, a hub answers only its first page (200 users by default).
    client = FakeHub([ALICE, BOB, {**BOB, "name": "cy"}])
    assert [u["name"] for u in hub.every_user(client)] == ["alice", "bob", "cy"]
    assert [path for _, path in client.requests] == [
        "/users?include_stopped_servers=1&offset=0",
        "/users?include_stopped_servers=1&offset=1",
        "/users?include_stopped_servers=1&offset=2",
    ]


def test_users_see_only_their_own_servers_admins_all() -> None:
    users = hub.every_user(FakeHub())
    assert {r.user for r in hub.servers_in_scope(users, Scope("alice"))} == {"alice"}
    assert hub.servers_in_scope(users, Scope("bob")) == []  # alice's servers are not bob's to see
    assert {r.user for r in hub.servers_in_scope(users, Scope("root", everyone=True))} == {"alice"}


def test_server_counts_are_the_clusters_without_names() -> None:
    assert hub.server_counts(hub.every_user(FakeHub())) == {"running": 1, "starting": 1, "users": 1}


def test_a_teacher_lists_their_class_members_servers() -> None:
    teacher = access.scope_of(
        Identity("tina"),
        read_groups([{"name": "ml101", "teachers": ["tina"], "members": ["ghost"]}]),
        {"ml101": ["alice", "bob"]},
    )
    assert {r.user for r in hub.servers_in_scope(hub.every_user(FakeHub()), teacher)} == {"alice"}
    student = access.scope_of(
        Identity("bob"), read_groups([{"name": "ml101", "teachers": ["tina"]}]), {"ml101": ["alice", "bob"]}
    )
    assert not student.sees("alice") and student.sees("bob") and not student.teaches


def test_stop_is_authorized_on_the_server_side() -> None:
    client = FakeHub()
    with pytest.raises(PermissionError, match="only admins can stop other people's"):
        hub.stop_server(client, Identity("bob"), "alice", "")
    assert client.requests == []
    hub.stop_server(client, Identity("alice"), "alice", "big")
    hub.stop_server(client, Identity("root", admin=True), "alice", "")
    assert client.requests == [("DELETE", "/users/alice/servers/big"), ("DELETE", "/users/alice/server")]


def test_groups() -> None:
    assert hub.groups(FakeHub()) == {"ml101": ["alice", "bob"]}


PROM_VECTOR = [
    {
        "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "localhost", "gpu": "0", "UUID": "SIM-0"},
        "value": [1795324830.7, "37"],
    },
    {
        "metric": {"__name__": "DCGM_FI_DEV_FB_USED", "Hostname": "localhost", "gpu": "0"},
        "value": [1795324830.7, "2048"],
    },
    {
        "metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "localhost", "gpu": "1"},
        "value": [1795324830.7, "79"],
    },
]


class FakePrometheus:
    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.answer, self.error, self.queries = answer, error, []  # type: ignore[var-annotated]

    def custom_query(self, query: str) -> Any:
        self.queries.append(query)
        if self.error:
            raise self.error
        return self.answer

    def custom_query_range(self, query: str, **kwargs: Any) -> Any:
        self.queries.append(query)
        if self.error:
            raise self.error
        return [{"metric": {}, "values": [[1795324800, "1"], [1795324815, "2.5"]]}]


def test_gpu_readings_in_one_query() -> None:
    prom = FakePrometheus(PROM_VECTOR)
    readings = prometheus.gpu_readings(prom)  # type: ignore[arg-type]
    assert len(prom.queries) == 1
    assert readings[("localhost", "0")] == prometheus.GpuReading(utilization_pct=37, used_bytes=2048 * 2**20)
    assert readings[("localhost", "1")].last_xid == 79


def test_trend_and_unavailable() -> None:
    assert [v for _, v in prometheus.trend(FakePrometheus(), "x", 1)] == [1.0, 2.5]  # type: ignore[arg-type]
    down = FakePrometheus(error=requests.ConnectionError("refused"))
    with pytest.raises(prometheus.MetricsUnavailableError, match="ConnectionError"):
        prometheus.gpu_readings(down)  # type: ignore[arg-type]
    with pytest.raises(prometheus.MetricsUnavailableError):
        prometheus.trend(down, "x", 1)  # type: ignore[arg-type]


AM_ALERTS = [
    {
        "annotations": {
            "summary": "GPU 1 on localhost reported Xid 79",
            "description": "d",
            "runbook": "docs/runbook.md#gpuxiderror",
        },
        "endsAt": "2026-11-22T06:03:10.000Z",
        "fingerprint": "6a0c2f0b4f6c5e4b",
        "receivers": [{"name": "critical"}],
        "startsAt": "2026-11-22T05:59:10.000Z",
        "status": {"inhibitedBy": [], "silencedBy": [], "state": "active"},
        "updatedAt": "2026-11-22T05:59:10.000Z",
        "generatorURL": "http://127.0.0.1:9090/graph",
        "labels": {"alertname": "GpuXidError", "gpu": "1", "severity": "critical"},
    },
    {
        "annotations": {"summary": "s"},
        "startsAt": "2026-11-22T05:50:00.000Z",
        "status": {"state": "active"},
        "labels": {"alertname": "GpuTemperatureHigh", "severity": "warning"},
    },
]


class FakeSession(requests.Session):
    def __init__(self, answer: Any, status: int = 200) -> None:
        super().__init__()
        self.answer, self.status = answer, status

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        response = requests.Response()
        response.status_code = self.status
        response._content = __import__("json").dumps(self.answer).encode()
        response.url = str(url)
        return response


def test_alerts_from_alertmanager_most_severe_first() -> None:
    rows = Alertmanager("http://am", FakeSession(list(reversed(AM_ALERTS)))).rows()
    assert [r.name for r in rows] == ["GpuXidError", "GpuTemperatureHigh"]
    assert rows[0].runbook == "docs/runbook.md#gpuxiderror" and rows[0].started is not None


def test_alertmanager_down_is_reported_as_unavailable() -> None:
    with pytest.raises(prometheus.MetricsUnavailableError, match="Alertmanager"):
        Alertmanager("http://am", FakeSession({}, status=503)).rows()


def test_per_gpu_trend_and_spawn_success() -> None:
    class Range(FakePrometheus):
        def custom_query_range(self, query: str, **kwargs: Any) -> Any:
            self.queries.append(query)
            return [
                {"metric": {"Hostname": "n1", "gpu": "0"}, "values": [[1795324800, "10"], [1795324860, "20"]]},
                {"metric": {"Hostname": "n1", "gpu": "1"}, "values": [[1795324800, "0"], [1795324860, "5"]]},
            ]

    prom = Range()
    series = prometheus.per_gpu_trend(prom, "DCGM_FI_DEV_GPU_UTIL", 1)  # type: ignore[arg-type]
    assert len(prom.queries) == 1
    assert {k: [v for _, v in pts] for k, pts in series.items()} == {"n1 GPU 0": [10.0, 20.0], "n1 GPU 1": [0.0, 5.0]}
    assert prometheus.spawn_success_ratio(FakePrometheus([{"metric": {}, "value": [0, "0.8"]}])) == 0.8  # type: ignore[arg-type]
    assert prometheus.spawn_success_ratio(FakePrometheus([{"metric": {}, "value": [0, "NaN"]}])) is None  # type: ignore[arg-type]
    assert prometheus.spawn_success_ratio(FakePrometheus([])) is None  # type: ignore[arg-type]


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A server that accepts connections and never answers (a stopped Prometheus or Alertmanager)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def within(seconds: float, call: Callable[[], object]) -> object:
    """call(), or a failure if it has not returned in seconds (the thread is left to die)."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(call).result(timeout=seconds)
    finally:
        pool.shutdown(wait=False)


@pytest.mark.process
def test_a_hung_prometheus_times_out_instead_of_hanging_the_page(hung_server: str) -> None:
    client = prometheus.connect(hung_server, timeout_s=1)
    for query in (lambda: prometheus.summary(client), lambda: prometheus.trend(client, "up", 1)):
        with pytest.raises(prometheus.MetricsUnavailableError, match=r"Prometheus did not answer \(timed out\)"):
            within(10, query)


@pytest.mark.process
def test_a_hung_alertmanager_times_out(hung_server: str) -> None:
    with pytest.raises(prometheus.MetricsUnavailableError, match=r"Alertmanager did not answer \(timed out\)"):
        within(10, lambda: Alertmanager(hung_server, timeout_s=1).rows())


@pytest.mark.process
def test_a_hung_hub_is_reported_as_unavailable(hung_server: str) -> None:
    client = hub.HubClient(f"{hung_server}/hub/api", "token", timeout_s=1)
    with pytest.raises(errors.SourceUnavailableError, match=r"JupyterHub did not answer \(timed out\)"):
        within(10, lambda: hub.every_user(client))


@pytest.mark.process
def test_a_hub_that_is_gone_or_behind_a_failing_proxy_is_unavailable(hung_server: str) -> None:
    class Gateway(requests.Session):
        def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
            response = requests.Response()
            response.status_code = 503
            return response

    with pytest.raises(errors.SourceUnavailableError, match="HTTP 503"):
        hub.HubClient("http://hub/hub/api", "t", session=Gateway()).get("/users")
    gone = hub.HubClient(hung_server.rsplit(":", 1)[0] + ":1/hub/api", "t", timeout_s=1)
    with pytest.raises(errors.SourceUnavailableError, match="ConnectionError"):
        gone.get("/users")


def test_the_watchdog_heartbeat_is_not_listed_as_an_alert() -> None:
    heartbeat = {"labels": {"alertname": "Watchdog", "severity": "none"}, "annotations": {}, "status": {}}
    rows = Alertmanager("http://am", FakeSession([heartbeat, *AM_ALERTS])).rows()
    assert [r.name for r in rows] == ["GpuXidError", "GpuTemperatureHigh"]
