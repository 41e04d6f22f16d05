"""Alertmanager, then Prometheus, stop answering while people spawn and read the portal.

Real processes throughout: `gpuslice up` with its Prometheus and Alertmanager, the portal
through its gate in Debian's Chromium. A hung process (SIGSTOP) is the harder case for
the portal (a slow backend must time out, not hang the page); a killed one (SIGKILL) must
be started again by `gpuslice up`.
"""

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from prometheus_api_client import PrometheusConnect

from tests.e2e.alerting import Webhook, wait_for
from tests.e2e.browser import ARGS, CHROMIUM, login
from tests.e2e.platform import Platform, free_port

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "portal"
PORTS = ("exporter_port", "prometheus_port", "alertmanager_port", "node_exporter_port")


def pid_of(platform: Platform, name: str) -> int:
    return int((platform.data_dir / "monitoring" / f"{name}.pid").read_text())


def page_shows(page: Page, portal_url: str, path: str, *texts: str, timeout_ms: int = 60_000) -> None:
    page.goto(f"{portal_url}/services/portal/{path}")
    for text in texts:
        page.wait_for_selector(f"text={text}", state="attached", timeout=timeout_ms)


def spawn(platform: Platform, user: str) -> None:
    session = platform.login(user)
    assert session.api("POST", f"/users/{user}/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    session.wait_ready(user)


@pytest.mark.waits  # most of it is Prometheus's two minutes before AlertmanagerDown fires
def test_monitoring_down_spawning_and_the_portal_go_on_and_it_recovers(make_platform: Any) -> None:
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    webhook = Webhook()
    ports = {k: free_port() for k in PORTS}
    platform: Platform = make_platform(
        monitoring={"scrape_interval": "1s", "webhook_url": webhook.url, **ports},
        portal_port=free_port(),
        streamlit_port=free_port(),
    )
    platform.start()
    prometheus = PrometheusConnect(
        url=f"http://127.0.0.1:{ports['prometheus_port']}", disable_ssl=True, auth=platform.monitoring_auth()
    )

    def targets_up() -> bool:
        try:
            up = prometheus.custom_query("up")
        except Exception:  # Prometheus restarting
            return False
        return len(up) >= 4 and all(r["value"][1] == "1" for r in up)

    wait_for(targets_up, "every scrape target to be up", 60)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        login(page, platform, "admin")

        # Alertmanager hangs: spawns work, the Alerts page says so, Prometheus sees it down.
        alertmanager = pid_of(platform, "alertmanager")
        os.kill(alertmanager, signal.SIGSTOP)
        try:
            spawn(platform, "bob")
            page_shows(page, platform.url, "alerts", "Alertmanager is unavailable")
            page_shows(page, platform.url, "servers", "bob")
            # Off the live page while Prometheus takes its two minutes: a Servers page left open reruns
            # twice a second (portal/sources/clients.py REFRESH_S), 20 s of CPU a minute on this machine.
            page.goto("about:blank")

            def firing() -> bool:
                return bool(prometheus.custom_query('ALERTS{alertname="AlertmanagerDown", alertstate="firing"}'))

            wait_for(firing, "AlertmanagerDown to fire in Prometheus (for: 2m)", 200)
        finally:
            os.kill(alertmanager, signal.SIGCONT)
        # Back: the alert Prometheus could not deliver reaches the webhook.
        wait_for(
            lambda: [a for a in webhook.received if a["labels"]["alertname"] == "AlertmanagerDown"],
            "AlertmanagerDown at the webhook once Alertmanager answers again",
            150,
        )

        # Prometheus hangs: spawns work, the portal says metrics are unavailable and still shows
        # allocations and servers; the page answers within the client's timeout.
        first = pid_of(platform, "prometheus")
        os.kill(first, signal.SIGSTOP)
        spawn(platform, "cy")
        page_shows(page, platform.url, "", "GPU readings are not available right now", "Servers running")
        page.screenshot(path=str(ARTIFACTS / "overview-prometheus-down.png"), full_page=True)
        page_shows(page, platform.url, "servers", "cy", "bob")
        page.goto("about:blank")

        # Prometheus is killed: `gpuslice up` starts it again, and the portal's metrics come back.
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: pid_of(platform, "prometheus") != first, "gpuslice up to start Prometheus again", 30)
        wait_for(targets_up, "every scrape target up after the restart", 90)
        page_shows(page, platform.url, "", "GPU memory in use")
        assert page.locator("text=GPU readings are not available right now").count() == 0
        browser.close()
    webhook.server.shutdown()
