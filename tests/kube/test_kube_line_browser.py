"""The GPU line on Kubernetes in a browser: the same pages a student meets on one machine.

A real JupyterHub with KubeGpuSpawner on the API double (one 8 GiB card), driven by Debian's
Chromium: Start joins the line at once (the waiting page), and JupyterLab once a slice frees.
Screenshots go to test-artifacts/kube-line/.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.test_kube_line import hub_on_one_card, line, pods, two_classmates_run
from tests.kube.test_kube_restart import RestartableHub

SHOTS = Path(__file__).parents[2] / "test-artifacts" / "kube-line"


@pytest.fixture
def one_card(tmp_path: Path) -> Iterator[RestartableHub]:
    yield from hub_on_one_card(tmp_path)


def test_in_the_browser_the_third_student_waits_with_no_pod_and_lands_in_jupyterlab(one_card: RestartableHub) -> None:
    from playwright.sync_api import sync_playwright

    from tests.e2e.browser import ARGS, CHROMIUM, log_in

    kube = one_card.hub
    two_classmates_run(one_card)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        log_in(page, kube.url, "s3", "any")  # the test hub's dummy authenticator

        page.goto(f"{kube.url}/hub/spawn")
        page.select_option("#gpu", "4GiB")
        page.click(".feedback-container button[type=submit]")  # JupyterHub's Start
        page.wait_for_selector("#gpuslice-place:has-text('You are next in line.')", timeout=60_000)
        assert page.is_visible("text=Start without a GPU now instead")
        page.screenshot(path=str(SHOTS / "waiting-s3.png"), full_page=True)
        assert line(one_card) == ["s3/"]
        assert pods(one_card) == ["jupyter-s1", "jupyter-s2"]  # waiting makes no pod

        assert kube.api("DELETE", "/users/s1/server").status_code in (202, 204)
        page.wait_for_url("**/user/s3/lab**", timeout=120_000)  # nobody pressed anything
        page.wait_for_selector(".jp-Launcher", timeout=120_000)  # JupyterLab drawn, not only its shell
        page.screenshot(path=str(SHOTS / "lab-s3.png"))
        browser.close()
    assert pods(one_card) == ["jupyter-s2", "jupyter-s3"]
    assert line(one_card) == []
