"""Every portal page and the spawn flow in Chromium, at a laptop's and a phone's size, as a
student and as an admin: screenshots in test-artifacts/visual/, and the page itself checked
for text cut off by its box and for text boxes drawn over each other."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright

from tests.e2e.browser import ARGS, CHROMIUM, login
from tests.e2e.platform import Platform, free_port

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "visual"
SIZES = {"laptop": (1280, 800), "phone": (390, 844)}
PAGES = {
    "overview": ("", "Overview"),
    "gpus": ("gpus", "GPUs"),
    "servers": ("servers", "Servers"),
    "jobs": ("jobs", "Jobs"),
    "classes": ("classes", "Classes"),
    "images": ("images", "Image market"),
    "models": ("models", "Model market"),
    "runbook": ("runbook", "Runbook"),
    "usage": ("usage", "GPU usage"),
}
# The platform's alerts and incidents are for its admins: a student's menu has neither.
ADMIN_PAGES = {
    "alerts": ("alerts", "Alerts"),
    "incidents": ("incidents", "Incidents"),
    "anomalies": ("anomalies", "Anomalies"),
}

# Text-bearing elements the check looks at: cut off (overflow hidden or an ellipsis with more
# text than room) and overlapping (two boxes that are neither inside the other).
CHECK = (Path(__file__).parent / "visual_check.js").read_text()


@pytest.fixture
def school(make_platform: Any) -> Platform:
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    groups = {
        "ml101": {"members": ["alice", "bob", "cara"], "teachers": ["tina"], "max_slice": "4GiB", "budget": "8GiB"}
    }
    platform: Platform = make_platform(portal_port=free_port(), streamlit_port=free_port(), groups=groups)
    platform.start()
    return platform


# A page is drawn once its fonts are loaded and Streamlit has no script run going (its status
# widget), no placeholder (skeleton) and no element left from the run before (data-stale).
DRAWN = """() => document.fonts.status === 'loaded' && !document.querySelector(
  "[data-testid='stStatusWidget'], [data-testid*='keleton'], [data-stale='true']")"""


def _settle(page: Page) -> None:
    page.wait_for_function(DRAWN, polling=100, timeout=60_000)
    page.wait_for_timeout(300)  # the last element's layout after its script run ended


def _shoot(page: Page, name: str, settle: bool = True) -> dict[str, list[str]]:
    if settle:
        _settle(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    found: dict[str, list[str]] = page.evaluate(CHECK)
    return found


def _shoot_progress(page: Page, name: str) -> dict[str, list[str]]:
    """The spawn's progress page, shot at once: it moves on to JupyterLab by itself when the server
    is ready (once in a full run, while a portal page settles, and the check found no page).
    A spawn that is done before the shot is said so, not passed over."""
    try:
        if "spawn-pending" in page.url:
            return _shoot(page, name, settle=False)
    except PlaywrightError as exc:
        if "Execution context was destroyed" not in str(exc):
            raise
    page.wait_for_load_state()
    return {"cut": [], "overlaps": [], "moved_on": [f"the spawn was ready before the shot: {page.url}"]}


def test_every_page_and_the_spawn_flow_at_two_sizes_has_nothing_cut_off_or_overlapping(school: Platform) -> None:
    for user, size in (("alice", "4GiB"), ("bob", "2GiB")):
        session = school.login(user)
        assert session.api("POST", f"/users/{user}/server", json={"gpu_memory": size}).status_code in (201, 202)
        session.wait_ready(user)
    school.login("admin")
    school.login("cara")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: dict[str, dict[str, list[str]]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for size, (width, height) in SIZES.items():
            for who in ("bob", "admin"):
                page = browser.new_context(viewport={"width": width, "height": height}).new_page()
                login(page, school, who)
                for name, (path, title) in (PAGES | (ADMIN_PAGES if who == "admin" else {})).items():
                    page.goto(f"{school.url}/services/portal/{path}")
                    page.wait_for_selector(f"h1:has-text('{title}')", timeout=120_000)
                    problems[f"{name}-{who}-{size}"] = _shoot(page, f"{name}-{who}-{size}")
                if who == "bob":  # a student never sees another student's name
                    page.goto(f"{school.url}/services/portal/gpus")
                    page.wait_for_selector("h1:has-text('GPUs')", timeout=120_000)
                    _settle(page)
                    assert "alice" not in page.inner_text("body")
                page.close()
        for size in ("phone", "laptop"):  # the form at both sizes; started once, at the last
            width, height = SIZES[size]
            page = browser.new_context(viewport={"width": width, "height": height}).new_page()
            login(page, school, "cara")
            page.goto(f"{school.url}/hub/spawn")
            page.wait_for_selector("select[name=gpu]", timeout=120_000)
            problems[f"spawn-form-cara-{size}"] = _shoot(page, f"spawn-form-cara-{size}")
            # 2 GiB of the class's budget is left beside alice's and bob's: the class's 4 GiB slice is
            # still offered (marked busy), and Start with it joins the line at once: the waiting page.
            page.select_option("select[name=gpu]", "4GiB")
            page.click("#spawn_form button[type=submit]:not([hidden])")
            try:
                page.wait_for_selector("#gpuslice-line:not([hidden])", timeout=60_000)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / f"debug-waiting-{size}.png"), full_page=True)
                raise AssertionError(f"no place in line for 4 GiB at {page.url}") from None
            problems[f"spawn-waiting-cara-{size}"] = _shoot(page, f"spawn-waiting-cara-{size}")
            page.click("#stop-server-btn")  # Leave the line
            page.wait_for_selector("text=You left the line.", timeout=60_000)
            page.goto(f"{school.url}/hub/spawn")
            page.wait_for_selector("select[name=gpu]", timeout=120_000)
            if size == "laptop":  # the smallest slice starts now
                smallest = page.eval_on_selector_all(
                    "select[name=gpu] optgroup[label='A slice of one GPU'] option", "options => options[0].value"
                )
                page.select_option("select[name=gpu]", smallest)
                page.click("button[type=submit]")
                page.wait_for_url(re.compile("spawn-pending|/user/cara"), timeout=60_000)
                problems[f"spawn-progress-cara-{size}"] = _shoot_progress(page, f"spawn-progress-cara-{size}")
            page.close()
        browser.close()
    (ARTIFACTS / "problems.json").write_text(json.dumps(problems, indent=1))
    found = {name: p for name, p in problems.items() if p["cut"] or p["overlaps"]}
    assert not found, json.dumps(found, indent=1)


def test_the_check_finds_cut_off_and_overlapping_text() -> None:
    """The check against a page made to fail it: a metric cut off as the old Classes card was."""
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    html = """
      <div data-testid="stMetricValue" style="width:100px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap">
        8 GiB of 80 GiB</div>
      <p style="position:absolute;top:100px;left:0">Servers running</p>
      <p style="position:absolute;top:104px;left:10px">Idle for 30 min</p>
      <p>Fits easily</p>
    """
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 390, "height": 844})
        page.set_content(html)
        found = page.evaluate(CHECK)
        browser.close()
    assert [c.split('"')[1] for c in found["cut"]] == ["8 GiB of 80 GiB"]
    assert len(found["overlaps"]) == 1 and "Servers running" in found["overlaps"][0]
