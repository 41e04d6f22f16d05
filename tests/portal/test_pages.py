"""Every page with streamlit.testing's AppTest; the data layer is faked, Streamlit is real."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
import yaml
from streamlit.testing.v1 import AppTest

from hub.kube_values import KubeValues
from portal import auth, views
from portal.data import deployment
from portal.data.alertmanager import AlertRow
from portal.data.errors import SourceUnavailableError
from portal.data.hub import ClassInfo, ServerRow
from portal.data.incident_store import IncidentStore
from portal.data.prometheus import GpuReading, MetricsUnavailableError
from portal.identity import Identity
from portal.incidents import Alert, Incident, Notification, Silence
from portal.sources import alerts, classes, clients, line, metrics, servers
from spawner.class_store import ClassStore
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.ledger import Held, Ledger, ServerEvent
from spawner.usage import UsageRow
from tests.portal.line_hub import serve_line

pytestmark = pytest.mark.pages  # Streamlit pages run by AppTest: not in the fast tier

APP = str(Path(__file__).parents[2] / "portal" / "app.py")
SHARING_FIXTURES = Path(__file__).parents[1] / "spawner" / "sharing" / "fixtures"
GiB = 2**30
NOW = datetime.now(UTC)
TWO_HOURS_AGO = NOW - timedelta(hours=2)
HOLDS = [Held("alice/", 0, "alice", "", 4 * GiB, group="ml101", pid=10)]
SERVERS = [
    ServerRow("alice", "", "running", "4GiB", 0, "default", TWO_HOURS_AGO, TWO_HOURS_AGO, "/user/alice/"),
    ServerRow("bob", "", "starting", "0.5", 0, "torch", None, None),
    ServerRow("carl", "", "stopped", "12GiB", 0, "default", None, None),
]
EVENTS = {
    "alice/": ServerEvent("alice/", "started", 50, "server process started (pid 10)", NOW.timestamp()),
    "bob/": ServerEvent("bob/", "placed", 20, "placed: 8 GiB of GPU 1 (T4); starting the server", NOW.timestamp()),
    "carl/": ServerEvent("carl/", "refused", 100, "Nothing can hold 12 GiB of one GPU right now.", NOW.timestamp()),
}


def visible(identity: Identity, user: str) -> bool:
    return identity.admin or identity.name == user


def fake_inventory() -> tuple[object, list[Held]]:
    gpus = simulated_gpus("2x16GiB:T4")
    return build_local(gpus, [(h.gpu_index, h.allocation()) for h in HOLDS]), HOLDS


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, object]]:
    # Cached reads (the line, the hub's users) live in this process across tests: each test starts empty.
    st.cache_data.clear()
    state: dict[str, object] = {"identity": Identity("teacher", admin=True), "metrics_down": False, "stopped": []}

    def readings(value: object) -> object:
        def call(*args: object) -> object:
            if state["metrics_down"]:
                raise MetricsUnavailableError("Prometheus did not answer (ConnectionError)")
            return value

        return call

    monkeypatch.setattr(auth, "require_identity", lambda: state["identity"])
    monkeypatch.setattr(servers, "_all_inventory", fake_inventory)
    monkeypatch.setattr(servers, "servers", lambda identity: [s for s in SERVERS if visible(identity, s.user)])
    monkeypatch.setattr(
        servers, "server_events", lambda identity: {k: e for k, e in EVENTS.items() if visible(identity, k[:-1])}
    )

    def history(identity: Identity, user: str, server: str) -> list[ServerEvent]:
        if not visible(identity, user):
            raise PermissionError("not yours")
        return [EVENTS[f"{user}/{server}"]]

    monkeypatch.setattr(servers, "server_history", history)
    monkeypatch.setattr(classes, "groups", lambda: {"ml101": ["alice", "bob"]})
    monkeypatch.setattr(servers, "server_counts", lambda: {"running": 5, "starting": 1, "users": 4})
    monkeypatch.setattr(metrics, "gpu_readings", readings({("localhost", "0"): GpuReading(40, 3 * GiB, 60, 35, 0)}))
    monkeypatch.setattr(
        metrics, "summary", readings({"gpuslice:gpu_memory_used_bytes:sum": 0, "gpuslice:gpu_utilization:avg": 20})
    )
    monkeypatch.setattr(metrics, "trend", readings([(NOW, 1.0), (NOW, 2.0)]))
    monkeypatch.setattr(metrics, "spawn_success", readings(0.75))
    heat = readings({"localhost GPU 0": [(NOW, 10.0), (NOW, 50.0)]})
    monkeypatch.setattr(metrics, "utilization_heatmap", lambda hours, per_node=False: heat())
    monkeypatch.setattr(
        alerts,
        "_active_alerts",
        readings(
            [
                AlertRow(
                    "GpuXidError",
                    "critical",
                    "GPU 1 reported Xid 79",
                    "d",
                    "docs/runbook.md#gpuxiderror",
                    NOW,
                    "active",
                )
            ]
        ),
    )
    monkeypatch.setattr(metrics, "_usage_rows", lambda weeks: list(USAGE))
    # The GPU line: the hub's API over a ledger (empty unless a test puts someone in line).
    # The hub's classes: a store a test writes its classes to, read through the classes API's double.
    store = ClassStore(tmp_path / "classes.sqlite")
    state["classes"] = store
    state["hub"] = serve_line(
        monkeypatch, tmp_path / "ledger.sqlite", lambda: classes.group_rules(), lambda: classes.groups(), store
    )
    st.cache_resource.clear()  # the deployment: a test's (Kubernetes) must not stay for the next
    yield state
    st.cache_resource.clear()


USAGE = [
    UsageRow("2026-W47", "alice", "ml101", 6.0, 4.0),
    UsageRow("2026-W48", "alice", "ml101", 5.0, 1.0),
    UsageRow("2026-W48", "bob", "ml101", 3.0, 0.5),
    UsageRow("2026-W48", "carl", "", 8.0, 0.0),
]


def run(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page:
        at.switch_page(page)
        at.run()
    assert not at.exception, at.exception
    return at


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [str(m.value) for m in at.metric] + [m.label for m in at.metric]
    parts += [e.value for e in at.info] + [e.value for e in at.warning] + [e.value for e in at.caption]
    parts += [e.value for e in at.success] + [e.value for e in at.error]
    return "\n".join(str(p) for p in parts)


def test_overview(fakes: dict[str, object]) -> None:
    at = run()
    assert at.title[0].value == "Overview"
    assert [h.value for h in at.subheader] == ["You", "Cluster", "Waiting for a GPU"]  # each scope titled
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Your servers running"] == "0" and metrics["Your GPU memory held"] == "0 B"  # the admin's own
    assert metrics["GPUs"] == "2" and metrics["GPU memory allocated"] == "4 GiB"
    assert metrics["GPU memory capacity"] == "32 GiB"
    assert metrics["Servers running"] == "5" and metrics["Servers starting"] == "1"  # the hub's counts
    # The same readings as the GPUs page's "used" (the recording rule may lag: it says 0 here).
    assert metrics["GPU memory in use"] == "3 GiB" and metrics["Alerts firing"] == "1"
    assert metrics["Nodes healthy"] == "1 of 1" and metrics["Users with a server"] == "4"
    assert metrics["Spawns that started (1 h)"] == "75%"
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert [c["layout"]["title"]["text"] for c in charts] == [
        "Cluster GPU memory (GiB)",
        "Cluster mean GPU utilization (%)",
    ]
    assert all(c["layout"]["showlegend"] for c in charts)
    assert [c["layout"]["yaxis"]["range"] for c in charts] == [[0, 2.3], [0, 100]]


def test_a_students_overview_counts_their_own_servers_under_you(fakes: dict[str, object]) -> None:
    fakes["identity"] = Identity("alice")
    at = run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Your servers running"] == "1" and metrics["Your GPU memory held"] == "4 GiB"
    assert metrics["Servers running"] == "5"  # the cluster's, counted, not only hers
    # The platform's alerts and incidents are for admins: nothing of them on a student's pages.
    assert "Alerts firing" not in metrics and "GpuXidError" not in texts(at)
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        run("screens/alerts.py")
    with pytest.raises(PermissionError, match="alice may not read the platform's alerts"):
        alerts.active_alerts(Identity("alice"))


def test_overview_without_metrics_shows_a_banner_and_the_rest(fakes: dict[str, object]) -> None:
    fakes["metrics_down"] = True
    at = run()
    assert "GPU readings are not available right now" in at.warning[0].value
    assert {m.label for m in at.metric} >= {"GPUs", "GPU memory allocated", "Servers running"}


@pytest.mark.parametrize("page", [None, "screens/servers.py", "screens/classes.py"])  # GPUs reads no hub
def test_a_hub_that_does_not_answer_gets_a_message_not_a_traceback(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, page: str | None
) -> None:
    def busy(*args: object) -> object:
        raise SourceUnavailableError("JupyterHub did not answer (timed out)")

    monkeypatch.setattr(servers, "servers", busy)
    monkeypatch.setattr(classes, "groups", busy)
    at = run(page)  # run() asserts no exception reached the page
    assert "JupyterHub did not answer (timed out). This page needs it; reload in a moment." in texts(at)


def test_gpus_page(fakes: dict[str, object]) -> None:
    at = run("screens/gpus.py")
    assert at.title[0].value == "GPUs"
    assert "simulated" in at.info[0].value
    table = at.dataframe[0].value
    assert list(table["slices"]) == ["alice 4 GiB", ""]
    assert list(table["utilization"]) == ["40%", "n/a"]
    assert len(at.get("plotly_chart")) == 2  # allocation bars and the utilization heatmap
    fakes["metrics_down"] = True
    at = run("screens/gpus.py")
    assert "Live readings are unavailable" in at.warning[0].value
    assert list(at.dataframe[0].value["allocated"]) == ["4 GiB", "0 B"]


def test_jobs_page_for_an_admin_lists_everyone_says_why_and_can_stop(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[tuple[str, str, str]] = []
    from portal.data import hub

    monkeypatch.setattr(
        hub, "stop_server", lambda client, identity, user, server: stopped.append((identity.name, user, server))
    )
    at = run("screens/servers.py")
    table = at.dataframe[0].value
    assert list(table["user"]) == ["alice", "bob", "carl"]
    assert list(table["state"]) == ["running", "pending", "refused"]
    assert list(table["last activity"])[1:] == ["never", "never"]  # not "None"
    reasons = " ".join(m.value for m in at.markdown).replace("\\", "")  # the full reasons, wrapped
    assert "carl/(default)** (refused): Nothing can hold 12 GiB of one GPU right now." in reasons
    assert list(table["slice"]) == ["4 GiB", "0.5 of a GPU", "12 GiB"]  # sizes written one way
    assert list(table["why"]) == [
        "",
        "placed: 8 GiB of GPU 1 (T4); starting the server",
        "Nothing can hold 12 GiB of one GPU right now.",
    ]
    assert list(table["progress"])[1] == 20
    # Two hours since the fake server started (plus however long the suite has run so far).
    assert table["age"].iloc[0].startswith("2 h ") and table["idle"].iloc[0].startswith("2 h ")
    assert "1 pending" in at.caption[0].value and "1 refused" in at.caption[0].value
    assert len(at.dataframe) == 1  # the history is not read until the reader opens it
    at.session_state["history-open"] = True
    at.run()
    assert list(at.dataframe[1].value["message"]) == ["server process started (pid 10)"]  # history of alice
    at.session_state["history-open"] = False
    at.run()
    at.multiselect[0].select("refused").run()
    assert list(at.dataframe[0].value["user"]) == ["carl"]
    at.multiselect[0].unselect("refused").run()
    at.text_input[0].input("torch").run()
    assert list(at.dataframe[0].value["user"]) == ["bob"]
    at.text_input[0].input("").run()
    at.button[0].click().run()
    assert stopped == [("teacher", "alice", "")]


def test_jobs_page_for_a_user_shows_only_their_servers_and_events(fakes: dict[str, object]) -> None:
    fakes["identity"] = Identity("carl")
    at = run("screens/servers.py")
    assert list(at.dataframe[0].value["user"]) == ["carl"]
    assert list(at.dataframe[0].value["why"]) == ["Nothing can hold 12 GiB of one GPU right now."]
    assert not at.button  # nothing of theirs is running, and nobody else's is offered


def test_jobs_page_shows_the_queue_in_order(fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    from spawner.line_admin import Waiting

    queue = [Waiting(1, "dan", "", "4 GiB of one GPU", "ml101", NOW.timestamp(), False)]
    monkeypatch.setattr(line, "waiting_line", lambda identity: queue if identity.admin else [])
    at = run("screens/servers.py")
    queue = at.table[0].value
    assert list(queue.index) == ["1st"] and list(queue["user"]) == ["dan"]
    assert list(queue["asked for"]) == ["4 GiB of one GPU"] and list(queue["class"]) == ["ml101"]
    assert list(queue["expected start"]) == ["not known"]
    fakes["identity"] = Identity("carl")
    assert "Nobody you can see waits for a GPU." in [c.value for c in run("screens/servers.py").caption]


def test_classes_page(fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "budget": "16GiB"})
    at = run("screens/classes.py")
    assert at.subheader[0].value == "ml101"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Members": "2",
        "Servers running": "1",
        "GPU memory held": "4 GiB",
        "Idle for 30 min": "1",
    }
    assert at.get("progress")[0].proto.text == "4 GiB of the 16 GiB budget held (25%)"  # in full, not in a card
    fakes["identity"] = Identity("carol")
    at = run("screens/classes.py")
    assert at.info[0].value == "You are in no class."


def test_alerts_page(fakes: dict[str, object]) -> None:
    at = run("screens/alerts.py")
    assert "GpuXidError" in at.markdown[-1].value or any("GpuXidError" in m.value for m in at.markdown)
    assert "(runbook#gpuxiderror)" in markdown_text(at)  # a link to the portal's Runbook page, at its section
    runbook = run("screens/runbook.py")
    assert any("## GpuXidError" in m.value for m in runbook.markdown)
    fakes["metrics_down"] = True
    at = run("screens/alerts.py")
    assert "Alertmanager is unavailable" in at.warning[0].value


def test_a_student_sees_no_platform_alert_anywhere(fakes: dict[str, object]) -> None:
    """Alerts and incidents are about the platform: not in a student's menu, refused on a direct
    visit, and refused by the data layer itself (issue 31: a student saw SpawnFailureRateHigh)."""
    fakes["identity"] = Identity("alice")
    for page in ("screens/alerts.py", "screens/incidents.py"):
        with pytest.raises(ValueError, match="Could not find a navigation page"):
            run(page)
    at = AppTest.from_file(str(Path(APP).parent / "screens" / "alerts.py"), default_timeout=30)
    at.session_state["identity"] = Identity("alice")
    at.run()
    assert at.error[0].value == "Alerts are about the platform and go to its admins."
    assert "GpuXidError" not in markdown_text(at)
    overview = run("screens/overview.py")
    assert "Alerts firing" not in texts(overview)


def test_the_data_layer_gives_alerts_to_admins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alerts, "_active_alerts", lambda: [AlertRow("NodeDown", "critical", "", "", "", NOW, "")])
    with pytest.raises(PermissionError, match="alice may not read the platform's alerts"):
        alerts.active_alerts(Identity("alice"))
    assert [a.name for a in alerts.active_alerts(Identity("root", admin=True))] == ["NodeDown"]


def markdown_text(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_no_identity_no_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLICE_PORTAL_SECRET", "00" * 32)
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    assert "Not signed in" in at.error[0].value
    assert not at.title  # nothing else rendered


@pytest.mark.process
def test_on_kubernetes_the_pages_read_the_charts_settings_and_the_hubs_classes(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.helm.test_kube_values import CLASSES, rendered_values

    monkeypatch.setenv("GPUSLICE_BACKEND", "kubernetes")
    monkeypatch.setenv("GPUSLICE_KUBE_VALUES", str(rendered_values(tmp_path, CLASSES)))
    clients.deployment.clear()  # type: ignore[attr-defined]
    assert metrics.prometheus_url() == "http://prometheus-operated.monitoring:9090"
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "budget": "16GiB"})  # as the hub seeded it
    at = run("screens/classes.py")
    assert at.subheader[0].value == "ml101"
    assert at.get("progress")[0].proto.text == "4 GiB of the 16 GiB budget held (25%)"


def add_class(fakes: dict[str, object], rules: dict[str, object]) -> None:
    store = fakes["classes"]
    assert isinstance(store, ClassStore)
    store.change(str(rules["name"]), lambda _: dict(rules))


PAGES = ["screens/overview.py", "screens/gpus.py", "screens/servers.py", "screens/classes.py", "screens/usage.py"]


def everything(at: AppTest) -> str:
    return texts(at) + "\n".join(frame.value.to_string() for frame in at.dataframe)


@pytest.fixture
def two_holders(fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    holds = [*HOLDS, Held("bob/", 0, "bob", "", 2 * GiB, group="ml101", pid=11)]
    monkeypatch.setattr(
        servers,
        "_all_inventory",
        lambda: (build_local(simulated_gpus("2x16GiB:T4"), [(h.gpu_index, h.allocation()) for h in holds]), holds),
    )
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "teachers": ["tina"], "budget": "16GiB"})


@pytest.mark.parametrize("page", PAGES)
def test_a_student_sees_their_own_slice_and_totals_never_another_students_name(
    two_holders: None, fakes: dict[str, object], page: str
) -> None:
    fakes["identity"] = Identity("bob")
    at = run(page)
    assert "alice" not in everything(at)
    if page == "screens/gpus.py":
        assert list(at.dataframe[0].value["slices"]) == ["bob 2 GiB, 1 other 4 GiB", ""]
        assert list(at.dataframe[0].value["allocated"]) == ["6 GiB", "0 B"]  # the totals stay true


def test_a_classes_teacher_and_an_admin_see_the_names(two_holders: None, fakes: dict[str, object]) -> None:
    for who in (Identity("tina"), Identity("root", admin=True)):
        fakes["identity"] = who
        at = run("screens/gpus.py")
        assert list(at.dataframe[0].value["slices"]) == ["alice 4 GiB, bob 2 GiB", ""]


def test_a_flat_trend_keeps_its_axis_from_zero_not_minus_one() -> None:
    from portal import charts

    flat = charts.trend({"in use": [(NOW, 0.0), (NOW, 0.0)]}, "GiB", "Cluster GPU memory (GiB)")
    assert list(flat.layout.yaxis.range) == [0, 1.0] and flat.layout.title.text == "Cluster GPU memory (GiB)"


def _ledger_with_a_waiter(path: Path, user: str, group: str) -> Ledger:
    from spawner.placement import Demand
    from spawner.waitline import Entry

    ledger = Ledger(path)
    now = datetime.now(UTC).timestamp()
    entry = Entry(f"{user}/", user, Demand(slice_units=float(4 * GiB)), 4 * GiB, group, now, seen=now, label="4 GiB")
    ledger.take_turn(entry.key, lambda holds, line, mine, reservations: (None, entry))
    return ledger


@pytest.mark.process
def test_an_admin_cancels_a_waiting_request_from_the_queue_view(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ledger = _ledger_with_a_waiter(tmp_path / "ledger.sqlite", "dan", "ml101")
    at = run("screens/servers.py")
    next(b for b in at.button if b.label == "Cancel the request").click().run()
    assert not at.exception, at.exception
    assert ledger.line() == []
    assert ledger.latest_events()["dan/"].message == "cancelled by teacher (admin) in the portal"
    said = "Cancelled: dan's page will say you did."
    assert said in texts(at)
    # The queue redraws itself twice a second without the button pressed: the outcome stays on it
    # (the request, and its buttons with it, are gone from the line by then).
    at.run()
    assert said in texts(at) and "Cancel the request" not in [b.label for b in at.button]


@pytest.mark.process
def test_a_click_acts_on_the_request_the_page_showed_once_however_often_it_arrives(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Streamlit replays a click after a refresh of the queue interrupts its run: seen in a browser, one
    click cancelled the first in line and then the next one. A click arriving again before the page showed
    the line moved up acts on nobody else; once the page shows the next request, a click cancels it."""
    for user in ("dan", "eve"):
        ledger = _ledger_with_a_waiter(tmp_path / "ledger.sqlite", user, "ml101")
    at = run("screens/servers.py")
    cancel = next(b for b in at.button if b.label == "Cancel the request")
    cancel.click().run()  # drawn with dan chosen and first: dan goes
    assert [e.user for e in ledger.line()] == ["eve"]
    next(b for b in at.button if b.label == "Cancel the request").click().run()  # again, the page still showing dan
    assert [e.user for e in ledger.line()] == ["eve"], "a replayed click cancelled a request nobody chose"
    assert "The list changed as you pressed: nothing was done" in texts(at)
    next(b for b in at.button if b.label == "Cancel the request").click().run()  # the page now shows eve
    assert ledger.line() == []
    assert "Cancelled: eve's page will say you did." in texts(at)


def test_the_overview_shows_wait_percentiles_per_class_and_day_in_the_viewers_scope(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for user, group in (("dan", "ml101"), ("eve", "ml101"), ("carl", "cv202")):
        _ledger_with_a_waiter(tmp_path / "ledger.sqlite", user, group)
        assert ledger.leave_line(f"{user}/")
    at = run()
    rows = at.dataframe[0].value.to_dict("records")
    assert [(r["class"], r["waits"], r["left without a GPU"]) for r in rows] == [("cv202", 1, 1), ("ml101", 2, 2)]
    assert rows[0]["day"] == NOW.strftime("%Y-%m-%d") and rows[0]["19 in 20 waited at most"].endswith(" s")
    assert "every class" in texts(at)
    st.cache_data.clear()
    fakes["identity"] = Identity("carl")
    at = run()
    assert [r["class"] for r in at.dataframe[0].value.to_dict("records")] == ["cv202"]  # his own wait only
    assert "your own requests only" in texts(at)
    st.cache_data.clear()
    fakes["identity"] = Identity("alice")
    assert "Nobody waited in line in these days." in texts(run())


@pytest.mark.process
def test_a_student_is_offered_no_line_controls_and_the_server_refuses_them(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ledger = _ledger_with_a_waiter(tmp_path / "ledger.sqlite", "carl", "ml101")
    fakes["identity"] = Identity("carl")
    at = run("screens/servers.py")
    labels = {b.label for b in at.button}
    assert not labels & {"Put first", "Cancel the request", "Remove the reservation"}
    assert not at.get("form")  # no reservation form either
    with pytest.raises(PermissionError, match="carl may not change the GPU line"):
        line.cancel_waiting(Identity("carl"), "carl", "")
    assert [e.key for e in ledger.line()] == ["carl/"]


class RecordingAlertmanager:
    """Alertmanager's answers as the data layer returns them (its real API is tested in tests/e2e/test_incidents.py)."""

    def __init__(self) -> None:
        self.silenced, self.acknowledged = list[Silence](), list[tuple[str, str, str]]()

    def silences(self) -> list[Silence]:
        return self.silenced

    def acknowledge(self, incident: Incident, by: str, comment: str, hours: float, now: datetime) -> str:
        self.acknowledged.append((incident.title, by, comment))
        self.silenced.append(Silence("s1", by, comment, now, incident.silence_matchers()))
        return "s1"


@pytest.fixture
def incidents(fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RecordingAlertmanager:
    """A store as the recorder leaves it: the alerts Alertmanager listed, a page to the first line."""
    started = NOW - timedelta(hours=1)
    node = Alert("a", {"alertname": "NodeDown", "severity": "critical", "node": "n1"}, started, "n1 is down")
    xid = Alert(
        "b",
        {"alertname": "GpuXidError", "severity": "critical", "node": "n1", "gpu": "0"},
        started,
        "Xid 79",
        "docs/runbook.md#gpuxiderror",
        inhibited_by=("a",),
    )
    store = IncidentStore(tmp_path / "incidents.sqlite")
    store.sync([node, xid], [], started + timedelta(seconds=5))
    store.record_notification(Notification("first-line-alice", started + timedelta(seconds=1), (node.key,)), [node])
    manager = RecordingAlertmanager()
    monkeypatch.setattr(alerts, "alertmanager_client", lambda: manager)
    monkeypatch.setattr(alerts, "incident_store", lambda: store)
    return manager


def test_incidents_page_groups_times_acknowledges_and_escapes_notes(incidents: RecordingAlertmanager) -> None:
    at = run("screens/incidents.py")
    page = markdown_text(at)
    assert "**NodeDown on node n1** · critical · open, not acknowledged" in page
    assert "escalated" not in page  # Alertmanager notified no second line
    assert views.plain("Alertmanager notified first-line-alice of NodeDown") in page
    assert (
        "**GpuXidError** node n1, gpu 0 (explained by another alert here): Xid 79 · [runbook](runbook#gpuxiderror)"
        in page
    )
    at.text_input(key=next(k for k in at.session_state if k.startswith("ack-text-"))).input("rebooting n1")
    at.button[0].click().run()  # Acknowledge
    assert incidents.acknowledged == [("NodeDown on node n1", "teacher", "rebooting n1")]
    assert "acknowledged by teacher" in markdown_text(at)
    assert "rebooting n1" in markdown_text(at)
    note_key = next(k for k in at.session_state if k.startswith("note-text-"))
    hostile = "<img src=x onerror=alert(1)> **bold** [x](javascript:alert(1))"
    at.text_area(key=note_key).input(hostile)
    next(b for b in at.button if b.label == "Add note").click().run()
    page = markdown_text(at)
    assert f"**teacher**: {views.plain(hostile)}" in page
    assert "<img" not in page.replace("\\<img", "")


def test_incidents_are_for_admins_only(incidents: RecordingAlertmanager, fakes: dict[str, object]) -> None:
    fakes["identity"] = Identity("alice")
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        run("screens/incidents.py")  # not in a non-admin's menu
    at = AppTest.from_file(str(Path(APP).parent / "screens" / "incidents.py"), default_timeout=30)
    at.session_state["identity"] = Identity("alice")  # the script run directly: its own check stops it
    at.run()
    assert at.error[0].value == "Incidents are about the platform and go to its admins."
    assert "NodeDown" not in markdown_text(at)
    with pytest.raises(PermissionError, match="alice may not read incidents"):
        alerts.incidents(Identity("alice"))


def test_usage_page_per_viewer_with_worst_holders_trend_and_csv(two_holders: None, fakes: dict[str, object]) -> None:
    def users(at: AppTest) -> list[str]:
        return sorted(set(at.dataframe[-1].value["user"]))

    at = run("screens/usage.py")  # an admin: everyone
    assert users(at) == ["alice", "bob", "carl"]
    assert list(at.dataframe[0].value["user"]) == ["carl", "alice", "bob"]  # most idle-held first
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Allocated (2026-W48)": "16.0 GPU-h",
        "Used (2026-W48)": "1.5 GPU-h",
        "Idle-held (2026-W48)": "14.5 GPU-h",
    }
    assert at.get("download_button")[0].proto.label == "Download CSV"
    fakes["identity"] = Identity("tina")  # ml101's teacher: her class, not carl
    at = run("screens/usage.py")
    assert users(at) == ["alice", "bob"] and "your classes'" in texts(at)
    fakes["identity"] = Identity("bob")  # a student: only himself, no ranking of others
    at = run("screens/usage.py")
    assert users(at) == ["bob"] and len(at.dataframe) == 1


def test_an_unwritable_incident_store_is_a_message_not_a_traceback(
    incidents: RecordingAlertmanager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.undo()  # the real incident_store, on a data directory that cannot hold a database
    (tmp_path / "data").write_text("a file where a folder should be")
    monkeypatch.setenv("GPUSLICE_DATA_DIR", str(tmp_path / "data"))
    clients.deployment.clear()  # the settings, with the data folder, are read once per process
    alerts.incident_store.clear()
    with pytest.raises(MetricsUnavailableError, match="give the portal a writable GPUSLICE_DATA_DIR"):
        alerts.incident_store()


def test_anomalies_page_shows_each_finding_with_its_evidence(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    import math

    minutes = 3 * 1440
    util = [50 + 45 * math.sin(m / 30) for m in range(minutes)]
    temp = [35 + 0.4 * u + math.sin(m * 12.9898) for m, u in enumerate(util)]
    for m in range(4000, 4060):
        temp[m] += 12  # on the third day, an hour too warm for its load
    stalled = [0.8 * u + 3 * math.sin(m * 7.1) for m, u in enumerate(util)]
    for m in range(3500, 3600):
        stalled[m] = 4.0  # n1/1, still held, stops working while n1/0 works on
    errors, total = [], 0.0
    for m in range(minutes):
        total += 1.0 if m % 30 == 0 else 0.0  # 2 an hour: its usual
        if 3000 <= m < 3360:
            total += 2 ** ((m - 3360) / 60)  # then doubling every hour for six hours
        errors.append(total)
    cards = [("n1", "0"), ("n1", "1")]
    history = {
        "utilization": {("n1", "0"): util, ("n1", "1"): stalled},
        "temperature": {("n1", "0"): temp},
        "memory": {card: [6 * GiB + 0.0] * minutes for card in cards},
        "errors": {("n1", "0"): [0.0] * minutes, ("n1", "1"): errors},
        "held": {card: [10.0 * GiB] * minutes for card in cards},
    }
    monkeypatch.setattr(metrics, "card_history", lambda: (NOW - timedelta(days=3), history))
    at = run("screens/anomalies.py")
    assert [m.value.split(",")[0] for m in at.markdown] == [
        "**hot for its load** on n1 GPU 0",
        "**utilization collapsed** on n1 GPU 1",
        "**correctable errors rising** on n1 GPU 1",
    ]
    captions = " ".join(c.value for c in at.caption)
    assert "its model expects" in captions and "its history predicts" in captions and "an hour and rising" in captions
    assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) == 3
    fakes["identity"] = Identity("alice")
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        run("screens/anomalies.py")
    with pytest.raises(PermissionError):
        metrics.anomalies(Identity("alice"))


def test_a_teacher_named_in_the_hubs_classes_sees_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hub's classes (the chart's or the settings', seeded into its store, and live changes) say who teaches.
    monkeypatch.setattr(classes, "_all_classes", lambda: [ClassInfo({"name": "ml101", "teachers": ["tina"]}, (), ())])
    monkeypatch.setattr(classes, "groups", lambda: {"ml101": ["alice", "bob"]})
    assert classes.scope(Identity("tina")).sees("alice")
    assert not classes.scope(Identity("bob")).sees("alice")


def test_a_teacher_manages_their_class_from_the_teaching_page(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Roster, invites, a student's server stopped, all through the hub (which checks again)."""
    monkeypatch.setattr(
        servers, "servers", lambda identity: [s for s in SERVERS if classes.scope(identity).sees(s.user)]
    )
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "teachers": ["tina"], "budget": "2 slices of 4GiB"})
    add_class(fakes, {"name": "cv202", "members": ["carl"], "teachers": ["tom"]})
    fakes["identity"] = Identity("tina")
    at = run("screens/teaching.py")
    assert at.title[0].value == "Teaching"
    assert [o for o in at.selectbox[0].options] == ["ml101"]  # her class only: the hub answered her token so
    assert at.get("progress")[0].proto.text == "GPU budget: 4 GiB of 8 GiB (2 slices of 4GiB) held now"
    roster = at.dataframe[0].value
    assert list(roster["student"]) == ["alice", "bob"] and list(roster["server"]) == ["running", "starting"]
    at.text_area[0].input("dee\nEve")  # typed, then the form's button: one run, as a browser sends them
    next(b for b in at.button if b.label == "Add to the class").click().run()
    assert not at.exception, at.exception
    store = fakes["classes"]
    assert isinstance(store, ClassStore)
    assert store.get("ml101")["members"] == ["alice", "bob", "dee", "eve"]  # type: ignore[index]
    assert "Nobody's server was stopped" in texts(at) and "`code-dee`" in markdown_text(at)
    assert at.get("download_button")[0].proto.label == "Download the invite codes"
    stop = next(b for b in at.button if b.label == "Stop this server")
    stop.click().run()
    hub_double = fakes["hub"]["tina"]  # type: ignore[index]
    assert hub_double.stopped == [("alice", "")]  # through the classes API: the hub stops it with its authority


class KaiCluster:
    """The Kubernetes API as the portal's KubeClient reads it: KAI's queues and the namespace's pods of
    tests/spawner/sharing/fixtures/kai_queues.yaml (every pod, whatever the selector), each path asked noted."""

    def __init__(self, *more_pods: dict[str, Any]) -> None:
        items = yaml.safe_load((SHARING_FIXTURES / "kai_queues.yaml").read_text())["items"]
        self.queues = {i["metadata"]["name"]: i for i in items if i["kind"] == "Queue"}
        self.pods = [*(i for i in items if i["kind"] == "Pod"), *more_pods]
        self.asked: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.asked.append(path)
        return self.queues.get(path.rsplit("/", 1)[1])

    def items(self, path: str) -> list[dict[str, Any]]:
        self.asked.append(path)
        return self.pods


def test_under_kai_a_teacher_sees_their_classs_queue_and_no_other_classs(
    fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The class's KAI queue on the Teaching page: its parent, GPU quota and limit, what KAI counts in it, and
    who waits in it with KAI's reason; a teacher of ml101 never has cv202's queue read for her."""
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "teachers": ["tina"]})
    add_class(fakes, {"name": "cv202", "members": ["carl", "dana"], "teachers": ["tom"]})
    fakes["identity"] = Identity("tina")
    assert "KAI queue" not in [h.value for h in run("screens/teaching.py").subheader]  # one machine: no KAI
    labels, annotations = {"kai.scheduler/queue": "ml101"}, {"hub.jupyter.org/username": "zed"}
    meta = {
        "name": "jupyter-zed",
        "labels": labels,
        "annotations": annotations,
        "creationTimestamp": "2026-03-09T09:00:00Z",
    }
    stranger = {"metadata": meta, "spec": {}}
    cluster = KaiCluster(stranger)  # someone of no class of hers, in her class's queue: counted, not named
    values = KubeValues.model_validate({"notebookImage": "nb", "proxyApiUrl": "http://proxy", "backend": "kai"})
    monkeypatch.setattr(clients, "deployment", lambda: deployment.Kubernetes(values, cluster))  # type: ignore[arg-type]
    classes._class_queue.clear()  # what the one machine answered a moment ago
    at = run("screens/teaching.py")
    assert "KAI queue" in [h.value for h in at.subheader]
    assert (
        "GPU quota: **2.5 GPUs** · GPU limit: **2.5 GPUs** · allocated: **0.25 of a GPU** · "
        "requested: **12 GiB of GPU memory**"
    ) in markdown_text(at)
    assert "queue **ml101** under **gpuslice**" in texts(at)
    waiting = next(f.value for f in at.dataframe if "why it waits" in f.value.columns)
    assert waiting.to_dict("records") == [
        {
            "student": "bob",
            "server": "(default)",
            "why it waits": "0/1 nodes are available: 1 node(s) didn't have enough resources: GPUs.",
        },
        {"student": "someone outside your classes", "server": "", "why it waits": "KAI has not tried to place it yet"},
    ]
    assert "zed" not in everything(at) and "dana" not in everything(at)
    assert any(p.endswith("/queues/ml101") for p in cluster.asked)
    assert not any("cv202" in p for p in cluster.asked)  # nor asked for her: only her class's queue is read
    with pytest.raises(PermissionError, match="only its teachers and admins can"):
        classes.class_queue(Identity("tina"), "cv202")
    with pytest.raises(PermissionError):
        classes.class_queue(Identity("alice"), "ml101")  # a student manages no class
    fakes["identity"] = Identity("root", admin=True)
    at = run("screens/teaching.py")
    at.selectbox[0].select("cv202").run()
    assert not at.exception, at.exception
    assert "allocated: **0.5 of a GPU** · requested: **0.5 of a GPU and 4 GiB of GPU memory**" in markdown_text(at)
    waiting = next(f.value for f in at.dataframe if "why it waits" in f.value.columns)
    assert list(waiting["student"]) == ["dana"]


def test_the_teaching_page_is_for_teachers_and_admins_and_a_teacher_stops_only_their_students(
    fakes: dict[str, object],
) -> None:
    add_class(fakes, {"name": "ml101", "members": ["alice", "bob"], "teachers": ["tina"]})
    fakes["identity"] = Identity("alice")
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        run("screens/teaching.py")  # not in a student's menu
    assert classes.taught(Identity("alice")) == []  # the hub gives a student no class to manage
    with pytest.raises(PermissionError, match="only admins, carl's teachers and carl can"):
        servers.stop_server(Identity("tina"), "carl", "")
    with pytest.raises(PermissionError, match="only admins can"):
        classes.add_class(Identity("tina"), "ml102", {}, ["x"])
    fakes["identity"] = Identity("root", admin=True)
    at = run("screens/teaching.py")
    assert "Add a class" in [e.label for e in at.expander]
