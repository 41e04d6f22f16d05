"""The portal in a real browser (Debian's Chromium driven by Playwright), through the hub's login."""

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from playwright.sync_api import sync_playwright

from portal.data.hub import HubClient
from portal.gate import streamlit_front_end
from portal.identity import Identity, sign
from tests.e2e.browser import ARGS, CHROMIUM, login
from tests.e2e.platform import Platform, free_port

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "portal"


@pytest.fixture
def portal(make_platform: Any) -> Platform:
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    platform: Platform = make_platform(portal_port=free_port(), streamlit_port=free_port())
    platform.start()
    return platform


@pytest.fixture(scope="module")
def shared_portal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One platform for the tests that only log in and read (a platform's start is 10 s of CPU)."""
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    platform = Platform(
        tmp_path_factory.mktemp("shared-portal"), {"portal_port": free_port(), "streamlit_port": free_port()}
    )
    try:  # stopped even when it fails to start
        platform.start()
        yield platform
    finally:
        platform.stop()


def test_every_page_through_the_gate_with_screenshots(portal: Platform) -> None:
    alice = portal.login("alice")
    assert alice.api("POST", "/users/alice/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    alice.wait_ready("alice")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        login(page, portal, "admin")
        expected = {
            "": "Overview",
            "gpus": "GPUs",
            "servers": "Servers",
            "jobs": "Jobs",
            "classes": "Classes",
            "alerts": "Alerts",
            "images": "Image market",
            "models": "Model market",
        }
        for path, title in expected.items():
            page.goto(f"{portal.url}/services/portal/{path}")
            page.wait_for_selector(f"h1:has-text('{title}')", timeout=120_000)
            if path in ("", "gpus", "alerts"):  # monitoring is off in this test: each page says so
                page.wait_for_selector("text=monitoring is off", timeout=120_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / f"{path or 'overview'}.png"), full_page=True)
        page.goto(f"{portal.url}/services/portal/gpus")
        page.wait_for_selector("text=alice 4 GiB", state="attached", timeout=120_000)  # the slice and its holder
        page.goto(f"{portal.url}/services/portal/")
        page.wait_for_selector("text=Signed in as", timeout=120_000)
        assert "admin" in page.inner_text("section[data-testid='stSidebar']")
        browser.close()


def test_a_student_launches_from_the_image_market_and_picks_a_model(portal: Platform) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        login(page, portal, "erin")
        page.goto(f"{portal.url}/services/portal/models")
        try:
            page.wait_for_selector("text=langid.py language identifier", timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "debug.png"), full_page=True)
            raise
        page.get_by_text("Use in notebook").first.click()
        page.wait_for_selector("text=Mounted read-only at ~/models/langid-97", timeout=120_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(ARTIFACTS / "models-in-use.png"), full_page=True)
        page.goto(f"{portal.url}/services/portal/images")
        page.wait_for_selector("text=Python (platform environment)", timeout=120_000)
        page.locator("button:has-text('Launch')").first.click()  # the only installed image here: default
        try:
            page.wait_for_selector("text=Starting your server with", timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "debug.png"), full_page=True)
            raise
        page.screenshot(path=str(ARTIFACTS / "images-launched.png"), full_page=True)
        browser.close()
    server = portal.login("erin").wait_ready("erin")
    # Launching asks for a GPU slice: erin is in no class, so the form's default is the smallest slice offered.
    assert server["user_options"] == {"image": "default", "gpu_memory": "512MiB"}
    home = portal.data_dir / "homes" / "erin" / "models"
    assert [p.name for p in home.iterdir()] == ["langid-97"]  # the picked model, mounted in the new server


def test_cross_site_websockets_are_refused(shared_portal: Platform) -> None:
    """Market writes travel over Streamlit's websocket: another site must not open it with our cookies."""
    portal = shared_portal
    from tornado import httpclient, ioloop, websocket

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context()
        page = context.new_page()
        login(page, portal, "frank")
        page.goto(f"{portal.url}/services/portal/")
        page.wait_for_selector("text=Signed in as", timeout=120_000)
        cookies = "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())
        browser.close()

    async def handshake(origin: str) -> int:
        request = httpclient.HTTPRequest(
            f"ws://127.0.0.1:{portal.port}/services/portal/_stcore/stream",
            headers={"Cookie": cookies, "Origin": origin},
        )
        try:
            connection = await websocket.websocket_connect(request)
        except httpclient.HTTPClientError as exc:
            return exc.code
        connection.close()
        return 101

    assert ioloop.IOLoop.current().run_sync(lambda: handshake(portal.url)) == 101
    assert ioloop.IOLoop.current().run_sync(lambda: handshake("https://evil.example")) == 403


def test_identity_cannot_be_forged(shared_portal: Platform) -> None:
    portal = shared_portal
    forged = sign(Identity("admin", admin=True), b"x" * 32)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        # Through the gate: the gate replaces whatever identity header the browser sends.
        page = browser.new_context(extra_http_headers={"X-Gpuslice-Identity": forged}).new_page()
        login(page, portal, "bob")
        page.goto(f"{portal.url}/services/portal/")
        page.wait_for_selector("text=Signed in as", timeout=120_000)
        sidebar = page.inner_text("section[data-testid='stSidebar']")
        assert "bob" in sidebar and "admin" not in sidebar
        # Straight to Streamlit, past the gate: the forged header is refused.
        streamlit = _streamlit_port(portal)
        direct = browser.new_context(extra_http_headers={"X-Gpuslice-Identity": forged}).new_page()
        direct.goto(f"http://127.0.0.1:{streamlit}/services/portal/")
        direct.wait_for_selector("text=Not signed in", timeout=120_000)
        assert "not signed by the portal's gate" in direct.inner_text("body")
        browser.close()


def test_pages_need_a_hub_login(shared_portal: Platform) -> None:
    portal = shared_portal
    import requests

    response = requests.get(f"{portal.url}/services/portal/", allow_redirects=False, timeout=10)
    assert response.status_code == 302 and "/hub/api/oauth2/authorize" in response.headers["Location"]
    script = f"{portal.url}/services/portal/static/js/{_a_streamlit_bundle()}"
    response = requests.get(script, allow_redirects=False, timeout=10)
    assert response.status_code == 302 and "/hub/api/oauth2/authorize" in response.headers["Location"]
    deadline = time.monotonic() + 60
    while (health := requests.get(f"{portal.url}/services/portal/_stcore/health", timeout=10)).status_code == 503:
        assert health.text == "starting" and time.monotonic() < deadline
        time.sleep(0.5)
    assert health.status_code == 200 and health.text == "ok"


def _a_streamlit_bundle() -> str:
    return next(f.name for f in sorted((streamlit_front_end() / "static" / "js").glob("*.js")))


def _streamlit_port(platform: Platform) -> int:
    return int(yaml.safe_load(platform.config.read_text())["streamlit_port"])


def _streamlit_pid(platform: Platform) -> int:
    port = _streamlit_port(platform)
    return next(c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN")


def test_the_gate_serves_streamlits_scripts_while_streamlit_is_busy(shared_portal: Platform) -> None:
    """A page's first load asks for about a hundred script files. The gate serves them, not the
    process that runs every open page (beside a live admin page they waited 4-19 s each there):
    with that process stopped outright, a logged-in browser still gets them, kept for a year."""
    portal = shared_portal
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context().new_page()
        login(page, portal, "bob")
        page.goto(f"{portal.url}/services/portal/")
        page.wait_for_selector("text=Signed in as", timeout=120_000)
        streamlit = _streamlit_pid(portal)
        os.kill(streamlit, signal.SIGSTOP)
        try:
            script = page.request.get(f"{portal.url}/services/portal/static/js/{_a_streamlit_bundle()}", timeout=10_000)
            assert script.status == 200, script.status
            assert "immutable" in script.headers["cache-control"]
            assert script.headers["content-type"].startswith(("application/javascript", "text/javascript"))
        finally:
            os.kill(streamlit, signal.SIGCONT)
        browser.close()


def _hub_says(session: Any, user: str, state: str, timeout_s: float = 90) -> float:
    """Poll the hub's API until the user's server is ``state`` (running or stopped); when it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server = session.api("GET", f"/users/{user}").json()["servers"].get("")
        now = time.monotonic()
        if state == "running" and server and server.get("ready"):
            return now
        if state == "stopped" and (not server or not (server.get("ready") or server.get("pending"))):
            return now
        time.sleep(0.02)
    raise AssertionError(f"the hub never said {user}'s server is {state}")


def _row_says(user: str, state: str) -> str:
    """A condition for the Jobs table: the user's default server's row has this state.

    The table's rows are in the DOM as an accessible grid (cells: user, server, state, ...)."""
    return (
        "[...document.querySelectorAll('tr')].some(r => { const c = [...r.cells].map(x => x.textContent.trim()); "
        f"return c[0] === '{user}' && c[1] === '(default)' && c[2] === '{state}'; }})"
    )


def _wait_or_screenshot(page: Any, condition: str, name: str) -> None:
    """Wait for a condition in the page (60 s: a loaded CI machine is slow, the lag is reported, not judged)."""
    try:
        page.wait_for_function(condition, polling=20, timeout=60_000)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"live-{name}-timeout.png"), full_page=True)
        raise


def test_jobs_and_overview_follow_the_hub_without_a_reload(portal: Platform) -> None:
    """The page shows each start and stop by itself; how far behind the hub it is goes to an artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    alice = portal.login("alice")
    # One page at a time, the portal's reader still gets every user from the real hub.
    every = HubClient(f"{portal.url}/hub/api", portal.token("admin"))
    names = [u["name"] for u in every.get("/users")]
    assert len(names) > 1 and [u["name"] for u in every.get_every_page("/users?limit=1")] == names
    lags: dict[str, list[float]] = {"servers": [], "overview": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        servers, overview = context.new_page(), context.new_page()
        login(servers, portal, "admin")
        servers.goto(f"{portal.url}/services/portal/servers")
        overview.goto(f"{portal.url}/services/portal/")
        servers.wait_for_selector("h1:has-text('Servers')", timeout=120_000)
        overview.wait_for_selector("text=Servers running", timeout=120_000)
        for _ in range(2):  # four lags a page, kept in live-lag.json below: a figure, not judged
            for state, method in (("running", "POST"), ("stopped", "DELETE")):
                assert alice.api(method, "/users/alice/server", json={"gpu_memory": "1GiB"}).status_code < 300
                seen = _hub_says(alice, "alice", state)
                # Neither page is reloaded: alice's row in the table says it, Overview counts running ones.
                # (Her row, not the caption's counts: other tests on this platform leave stopped servers.)
                _wait_or_screenshot(servers, _row_says("alice", state), f"servers-{state}")
                lags["servers"].append(time.monotonic() - seen)
                running = "1" if state == "running" else "0"
                _wait_or_screenshot(
                    overview,
                    "[...document.querySelectorAll('[data-testid=stMetric]')].some(m => "
                    f"m.innerText.startsWith('Servers running') && m.innerText.trim().endsWith('{running}'))",
                    f"overview-{state}",
                )
                lags["overview"].append(time.monotonic() - seen)
        browser.close()
    figures = {page: {"p50_s": round(sorted(v)[len(v) // 2], 2), "max_s": round(max(v), 2)} for page, v in lags.items()}
    print(f"portal behind the hub over {len(lags['servers'])} starts and stops: {figures}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "live-lag.json").write_text(json.dumps({"lags_s": lags, "figures": figures}, indent=1))
