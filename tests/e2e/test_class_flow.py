"""The class flow as docs/platform.md tells it, in a real browser (Debian's Chromium via Playwright).

A teacher adds a class with `gpuslice class add` (it prints the invite codes) and starts the
platform; a student opens /hub/join, types their name, code and the password they choose, lands
on the spawn form, presses Start and gets JupyterLab. As root the settings say nothing about
isolation: the defaults, so the student's server runs as their own account.
"""

import os
import subprocess
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from tests.e2e.browser import ARGS, CHROMIUM
from tests.e2e.platform import GPUSLICE, Platform

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "class-flow"
STUDENTS = ("lena", "mo")


def test_a_teacher_adds_a_class_and_a_student_joins_and_starts_in_chromium(make_platform: Any, tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs the Debian package chromium"
    defaults = {"isolation": None} if os.geteuid() == 0 else {}
    platform: Platform = make_platform(open_signup=False, **defaults)
    roster = tmp_path / "roster.csv"
    roster.write_text("username\n" + "\n".join(STUDENTS) + "\n")
    added = subprocess.run(
        [GPUSLICE, "class", "add", "ml101", str(roster), "--config", str(platform.config), "--max-slice", "4GiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    codes = dict(line.split(",") for line in added.stdout.splitlines() if "," in line and " " not in line)
    assert set(codes) == set(STUDENTS), added.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    platform.start(timeout_s=300)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            page.goto(f"{platform.url}/hub/join")
            page.fill("#username", "lena")
            page.fill("#code", codes["lena"])
            page.fill("#password", "lenas-own-password")
            page.fill("#password2", "lenas-own-password")
            page.screenshot(path=str(ARTIFACTS / "join.png"), full_page=True)
            page.click("#join")
            page.wait_for_url("**/hub/spawn**", timeout=30_000)
            page.wait_for_selector("select#gpu", timeout=30_000)
            assert page.locator("select#gpu option[selected]").get_attribute("value") == "4GiB"  # the class's slice
            page.screenshot(path=str(ARTIFACTS / "spawn-form.png"), full_page=True)
            page.get_by_role("button", name="Start").click()
            page.wait_for_url("**/user/lena/lab**", timeout=240_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            page.wait_for_timeout(2000)
            page.screenshot(path=str(ARTIFACTS / "lab.png"))
            # The code is spent: the same form with it again is refused.
            page.goto(f"{platform.url}/hub/join")
            page.fill("#username", "lena")
            page.fill("#code", codes["lena"])
            page.fill("#password", "a-strangers-password")
            page.fill("#password2", "a-strangers-password")
            page.click("#join")
            page.wait_for_selector("text=does not open this name", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "code-spent.png"), full_page=True)
            browser.close()
        platform.login("lena", "lenas-own-password")
    finally:
        platform.stop()
        if defaults:
            for name in STUDENTS:
                subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)
