"""The GPU line on Kubernetes: a real JupyterHub, KubeGpuSpawner and the API double's scheduler.

One card of 8 GiB: two 4 GiB slices fit, a third waits in line with no pod until one frees.
"""

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from hub.roles import PORTAL_OAUTH_SCOPES
from spawner.ledger import Ledger
from tests.kube.conftest import KubeHub, gpushare_node, login
from tests.kube.test_kube_restart import RestartableHub, running_hub

GiB = 2**30
PODS = "/api/v1/namespaces/gpuslice/pods?labelSelector=component%3Dsingleuser-server"


def hub_on_one_card(tmp_path: Path, reclaim_after: str = "") -> Iterator[RestartableHub]:
    # reclaim_after: the hub runs the GPU line's reclaimer with this idle timeout (s)
    env = {"GPUSLICE_TEST_RECLAIM_AFTER": reclaim_after} if reclaim_after else {}
    yield from running_hub(tmp_path, [gpushare_node("gpu-a", 1, 8)], env)


@pytest.fixture
def one_card(tmp_path: Path) -> Iterator[RestartableHub]:
    yield from hub_on_one_card(tmp_path)


@pytest.fixture
def one_card_reclaiming(tmp_path: Path) -> Iterator[RestartableHub]:
    yield from hub_on_one_card(tmp_path, reclaim_after="6")


def pods(hub: RestartableHub) -> list[str]:
    """The notebook pods the API holds (created, whatever their phase)."""
    return sorted(p["metadata"]["name"] for p in hub.hub.k8s(PODS)["items"])


def line(hub: RestartableHub) -> list[str]:
    return [e.key for e in Ledger(hub.root / "ledger.sqlite").line()]


def two_classmates_run(hub: RestartableHub) -> None:
    kube = hub.hub
    assert kube.api("POST", "/users", json={"usernames": ["s1", "s2", "s3", "s4"]}).status_code == 201
    for user in ("s1", "s2"):
        assert kube.api("POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
        kube.wait_ready(user)


@pytest.mark.waits
def test_the_third_student_waits_with_no_pod_and_starts_by_itself_and_a_fourth_leaves_the_line(
    one_card: RestartableHub,
) -> None:
    kube = one_card.hub
    two_classmates_run(one_card)

    refused = kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB"})
    assert refused.status_code == 409, refused.text
    assert 'or wait in line for it (add "wait": true)' in refused.json()["message"]

    assert kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (201, 202)
    waiting = kube.progress_until("s3", "Waiting in line")[-1]
    assert "Waiting in line for 4 GiB of one GPU. You are next in line. Expected start: " in waiting
    assert line(one_card) == ["s3/"]
    assert pods(one_card) == ["jupyter-s1", "jupyter-s2"]  # no pod for s3: the scheduler never sees it

    # Someone who does not wait cannot jump the line: refused while s3 waits.
    jumped = kube.api("POST", "/users/s4/server", json={"gpu_memory": "4GiB"})
    assert jumped.status_code == 409, jumped.text
    assert "1 request waits in line for a GPU before yours" in jumped.json()["message"]
    # s4 waits behind s3, then gives up: stopping the pending spawn leaves the line, nothing is created.
    assert kube.api("POST", "/users/s4/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (201, 202)
    assert "You are 2nd in line: 1 person is before you." in kube.progress_until("s4", "Waiting in line")[-1]
    assert kube.api("DELETE", "/users/s4/server").status_code in (202, 204)
    deadline = time.monotonic() + 30
    while line(one_card) != ["s3/"]:
        assert time.monotonic() < deadline, f"the stopped spawn stayed in the line: {line(one_card)}"
        time.sleep(0.2)
    assert pods(one_card) == ["jupyter-s1", "jupyter-s2"]

    assert kube.api("DELETE", "/users/s1/server").status_code in (202, 204)
    kube.wait_ready("s3", timeout_s=90)  # no second request: the line placed it
    assert line(one_card) == []
    assert "jupyter-s3" in pods(one_card)
    assert "jupyter-s4" not in pods(one_card)
    assert not kube.api("GET", "/users/s4").json()["servers"]


@pytest.mark.waits
def test_after_a_hub_kill_9_the_line_is_intact_and_the_request_keeps_its_place(one_card: RestartableHub) -> None:
    kube = one_card.hub
    two_classmates_run(one_card)
    assert kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (201, 202)
    kube.progress_until("s3", "Waiting in line")
    time.sleep(0.5)
    assert kube.api("POST", "/users/s4/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (201, 202)
    kube.progress_until("s4", "You are 2nd in line: 1 person is before you.")
    before = {e.key: e.arrived for e in Ledger(one_card.root / "ledger.sqlite").line()}

    assert one_card.process is not None
    one_card.kill_9()  # kill -9 of the hub's container: nothing is written on the way out
    one_card.process.wait()
    one_card.start()
    one_card.wait_healthy()
    after = {e.key: e.arrived for e in Ledger(one_card.root / "ledger.sqlite").line()}
    assert after == before, "the line changed across the hub's kill -9"
    assert pods(one_card) == ["jupyter-s1", "jupyter-s2"]

    # The restarted hub lost s3's spawn; starting it again takes the same place back (first).
    deadline = time.monotonic() + 60
    while kube.api("GET", "/users/s3").json()["servers"]:  # the hub cleans up the spawn it lost
        assert time.monotonic() < deadline, "the lost spawn stayed pending after the restart"
        time.sleep(0.5)
    assert kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    assert "You are next in line." in kube.progress_until("s3", "Waiting in line")[-1]
    assert kube.api("DELETE", "/users/s2/server").status_code in (202, 204)
    kube.wait_ready("s3", timeout_s=90)
    assert [e.key for e in Ledger(one_card.root / "ledger.sqlite").line()] == ["s4/"]


def test_concurrent_spawns_never_create_more_pods_than_fit(one_card: RestartableHub) -> None:
    kube = one_card.hub
    users = [f"c{i}" for i in range(5)]
    assert kube.api("POST", "/users", json={"usernames": users}).status_code == 201
    # A slow API server: each pod is listed only 2 s after the hub asked for it, so the spawns
    # decide while the pods already placed are not in any listing yet.
    slow = {"method": "POST", "path_contains": "/namespaces/gpuslice/pods", "status": "slow", "delay_s": 2}
    assert kube.k8s_post("/_test/faults", {**slow, "times": len(users)}).ok

    def press_start(user: str) -> int:
        return kube.api("POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"}).status_code

    with ThreadPoolExecutor(len(users)) as pool:
        answers = dict(zip(users, pool.map(press_start, users), strict=True))
    started = [u for u, status in answers.items() if status in (201, 202)]
    assert sorted(answers.values()).count(409) == 3, answers
    for user in started:
        kube.wait_ready(user)
    time.sleep(2)  # any late create would show by now
    assert pods(one_card) == sorted(f"jupyter-{u}" for u in started)


def notices_seen(kube: KubeHub, users: list[str], until: threading.Event) -> dict[str, list[str]]:
    """Each user's GPU-line warnings, as /hub/gpuslice/notice gives them to their own logged-in pages."""
    sessions = {user: login(kube.url, user, "any") for user in users}  # the dummy authenticator
    seen: dict[str, list[str]] = {user: [] for user in users}
    while not until.is_set():
        for user, session in sessions.items():
            answer = session.get(f"{kube.url}/hub/gpuslice/notice", allow_redirects=False, timeout=30)
            assert answer.status_code == 200, f"{user}: HTTP {answer.status_code}"
            seen[user] += [n["message"] for n in answer.json()["notices"]]
        time.sleep(0.2)
    return seen


def test_an_idle_gpu_server_is_warned_then_reclaimed_for_the_line(one_card_reclaiming: RestartableHub) -> None:
    kube = one_card_reclaiming.hub
    two_classmates_run(one_card_reclaiming)  # both idle from now on
    done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        watching = pool.submit(notices_seen, kube, ["s1", "s2"], done)
        try:
            assert kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (
                201,
                202,
            )
            kube.wait_ready("s3", timeout_s=90)  # nobody stopped anything: the reclaimer did
        finally:
            done.set()
        seen = watching.result()
    running = [u for u in ("s1", "s2") if kube.api("GET", f"/users/{u}").json()["servers"]]
    assert len(running) == 1, f"the line needed one slice, not {2 - len(running)}"
    stopped_user = ({"s1", "s2"} - set(running)).pop()
    kinds = [e.kind for e in Ledger(one_card_reclaiming.root / "ledger.sqlite").history(f"{stopped_user}/")]
    assert kinds[-2:] == ["warned", "stopping"], kinds  # warned first, then stopped
    # The owner was told on their own pages before the stop; the classmate who keeps the slice was not.
    assert any("Idle while others wait for a GPU" in m for m in seen[stopped_user]), seen
    assert seen[running[0]] == [], seen


def portal_token(kube: KubeHub, user: str, admin: bool = False) -> str:
    """A token like the portal's for its reader: their OAuth token, PORTAL_OAUTH_SCOPES as the hub
    narrows them to what the user holds (a non-admin may stop only their own servers)."""
    scopes = PORTAL_OAUTH_SCOPES if admin else [s if "!" in s else f"{s}!user" for s in PORTAL_OAUTH_SCOPES]
    made = kube.api("POST", f"/users/{user}/tokens", json={"scopes": scopes, "note": "as the portal's"})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def line_api(kube: KubeHub, token: str | None, method: str = "GET", body: object = None) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(method, f"{kube.url}/hub/api/gpuslice/line", headers=headers, json=body, timeout=30)


@pytest.mark.waits
def test_the_line_api_shows_the_queue_to_an_admin_and_lets_only_them_change_it(one_card: RestartableHub) -> None:
    kube = one_card.hub
    two_classmates_run(one_card)
    # s1, who runs one server, asks for a second before s3 asks for a first: s3 goes first
    # (round-robin between users), in the Queue as in the spawns' own progress.
    second = kube.api("POST", "/users/s1/servers/lab", json={"gpu_memory": "4GiB", "wait": True})
    assert second.status_code in (201, 202), second.text
    kube.progress_until("s1", "Waiting in line", server="lab")
    assert kube.api("POST", "/users/s3/server", json={"gpu_memory": "4GiB", "wait": True}).status_code in (201, 202)
    kube.progress_until("s3", "You are next in line.")
    admin = portal_token(kube, "line-admin", admin=True)  # an admin user in tests/kube/jupyterhub_config.py
    student = portal_token(kube, "s4")

    seen = line_api(kube, admin)
    assert seen.status_code == 200, seen.text
    waiting, behind = seen.json()["line"]
    assert (waiting["position"], waiting["user"], waiting["server"]) == (1, "s3", "")
    assert (behind["position"], behind["user"], behind["server"]) == (2, "s1", "lab")  # the pods: s1 holds one
    assert waiting["asked"] == "4 GiB of one GPU"
    assert waiting["estimated_start"] > waiting["since"]  # from s3's waiting spawn: when a classmate's slice frees
    assert behind["estimated_start"] >= waiting["estimated_start"]  # when the second classmate's slice frees
    assert kube.api("DELETE", "/users/s1/servers/lab").status_code in (202, 204)  # leaves the line

    # A student of no class: not s3's name, not its place, and no say.
    assert line_api(kube, student).json() == {"line": [], "waits": [], "reservations": []}
    refused = line_api(kube, student, "POST", {"action": "cancel", "user": "s3", "server": ""})
    assert refused.status_code == 403, refused.text
    assert "only admins and the teachers of a class can" in refused.json()["message"]
    # ml101's teacher: s3 is not in their class (neither seen nor changed).
    assert kube.api("POST", "/users", json={"usernames": ["tina"]}).status_code == 201
    teacher = portal_token(kube, "tina")
    assert line_api(kube, teacher).json()["line"] == []
    refused = line_api(kube, teacher, "POST", {"action": "put-first", "user": "s3", "server": ""})
    assert refused.status_code == 403 and "tina teaches ml101, not default" in refused.json()["message"]
    assert line_api(kube, None).status_code == 403  # no token
    # A service that may read every user (the portal's own token is one) reads every place, as it
    # reads every user's servers (the portal narrows both to each reader), and changes nothing.
    assert "s3" in [w["user"] for w in line_api(kube, kube.token).json()["line"]]
    for anonymous in (None, kube.token):
        assert line_api(kube, anonymous, "POST", {"action": "put-first", "user": "s3", "server": ""}).status_code == 403
    assert line(one_card) == ["s3/"]

    first = line_api(kube, admin, "POST", {"action": "put-first", "user": "s3", "server": ""})
    assert first.json() == {"done": True}, first.text
    assert Ledger(one_card.root / "ledger.sqlite").line()[0].priority == 1
    cancelled = line_api(kube, admin, "POST", {"action": "cancel", "user": "s3", "server": ""})
    assert cancelled.json() == {"done": True}, cancelled.text
    assert line(one_card) == []
    after = line_api(kube, admin).json()
    assert after["line"] == []
    waits = [(w["group"], w["waits"], w["placed"]) for w in after["waits"]]
    assert waits == [(waiting["group"], 2, 0)]  # s1's second (left) and s3's (cancelled)
    assert line_api(kube, student).json()["waits"] == []  # someone else's wait

    # Reservations: the hub counts the cluster's one 8 GiB card; a class's teacher keeps and drops their class's.
    day = {"start": time.time(), "end": time.time() + 3600}
    too_much = line_api(kube, admin, "POST", {"action": "reserve", "group": "ml101", "memory_bytes": 16 * GiB, **day})
    assert too_much.status_code == 400 and "more than the 8 GiB" in too_much.json()["message"], too_much.text
    made = line_api(kube, teacher, "POST", {"action": "reserve", "group": "ml101", "memory_bytes": 4 * GiB, **day})
    assert made.status_code == 200, made.text
    others = line_api(kube, teacher, "POST", {"action": "reserve", "group": "default", "memory_bytes": GiB, **day})
    assert others.status_code == 403, others.text
    assert [r["group"] for r in line_api(kube, student).json()["reservations"]] == ["ml101"]  # no names: anyone
    dropped = line_api(kube, teacher, "POST", {"action": "drop-reservation", "id": made.json()["id"]})
    assert dropped.json() == {"done": True}, dropped.text
