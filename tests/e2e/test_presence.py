"""Presence on the real platform, in Chromium: who left loses the slice to the line, who pauses keeps it.

One platform start, three students on one card of three slices, two classmates waiting:

* ``closer`` runs a cell, saves and closes the JupyterLab tab;
* ``walker`` types into a cell and leaves the page open without touching it again;
* ``typist`` runs a cell, then keeps typing (reading, editing) for longer than both presence timeouts
  before running the next one.

The line gets the closer's and the walker's slices (each after its own timeout, after a warning: the
walker's page saves its open notebook when the warning shows), never the typist's; at their next
start the closer and the walker find their notebooks reopened as they saved them, and a notice
saying why the server stopped. Timeouts compressed: a closed tab 30 s, a page without input 60 s.
"""

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tests.e2e.platform import Platform, admin_api

SHOTS = Path(__file__).parents[2] / "test-artifacts" / "presence"
STUDENTS = ("closer", "walker", "typist")
WAITERS = ("w1", "w2")
NOTEBOOK = {
    "type": "notebook",
    "content": {
        "cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    },
}


def events(platform: Platform, key: str) -> list[tuple[str, str, float]]:
    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        rows = db.execute("SELECT kind, message, created FROM server_event WHERE key = ? ORDER BY id", (key,))
        return [(str(k), str(m), float(c)) for k, m, c in rows.fetchall()]
    finally:
        db.close()


def pages_reported(platform: Platform, key: str) -> int | None:
    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        row = db.execute("SELECT pages FROM presence WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])
    finally:
        db.close()


def stopped_by_reclaimer(platform: Platform, key: str) -> bool:
    return any(k == "stopped" and "reclaimer" in m for k, m, _ in events(platform, key))


def open_notebook(page: Any, platform: Platform, user: str) -> None:
    page.goto(f"{platform.url}/user/{user}/lab/tree/work.ipynb")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    # The kernel connected and idle, as JupyterLab's status bar says it: the toolbar's execution indicator
    # reads idle from the start, before the session has a kernel, and a cell run then is dropped unrun
    # (JupyterLab clears a cell it has no kernel for): on a loaded machine the page is typed into that soon.
    page.wait_for_selector(".jp-StatusBar-TextItem[title^='Change kernel']:has-text('| Idle')", timeout=120_000)


def type_into_first_cell(page: Any, text: str) -> None:
    page.click(".jp-Notebook .jp-Cell .cm-content")
    page.keyboard.press("Control+a")
    page.keyboard.type(text)


def until(done: Callable[[], bool], what: str, timeout_s: float, while_waiting: Callable[[], None]) -> None:
    """Wait for ``done``, calling ``while_waiting`` every look (a student typing meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        while_waiting()
        time.sleep(0.5)


def start_again_in_the_browser(page: Any, platform: Platform, user: str) -> None:
    """The student's next start, from the spawn form, into the JupyterLab it opens by itself."""
    page.goto(f"{platform.url}/hub/spawn")
    page.select_option("#gpu", "4GiB")
    page.click(".feedback-container button[type=submit]")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=120_000)
    page.wait_for_selector(".jp-Notebook", timeout=120_000)  # reopened from the workspace kept in the home


def test_who_left_gives_the_slice_to_the_line_with_the_notebook_saved_and_who_pauses_keeps_it(
    make_platform: object,
) -> None:
    from playwright.sync_api import sync_playwright

    from tests.e2e.browser import ARGS, CHROMIUM, login

    SHOTS.mkdir(parents=True, exist_ok=True)
    platform: Platform = make_platform(  # type: ignore[operator]
        gpus={"simulate": "1x12GiB:T4"},
        gpu_idle_timeout=180,  # 60 s warnings, reports every 10 s: the idle rule stays out of the way
        gpu_left_timeout=30,
        gpu_no_input_timeout=60,
        gpu_release_timeout=150,
    )
    platform.start()
    token = platform.token("admin")
    for user in (*STUDENTS, *WAITERS):
        assert admin_api(platform, token, "POST", f"/users/{user}").status_code in (201, 409)
    for user in STUDENTS:
        started = admin_api(platform, token, "POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"})
        assert started.status_code in (201, 202), started.text
    for user in STUDENTS:
        platform.login(user).wait_ready(user, timeout_s=180)
        saved = requests.put(
            f"{platform.url}/user/{user}/api/contents/work.ipynb",
            headers={"Authorization": f"token {token}"},
            json=NOTEBOOK,
            timeout=60,
        )
        assert saved.status_code in (200, 201), saved.text
    walker_session = platform.login("walker")
    # Who may report for a server: its owner's tokens (the server's own among them), nobody else's
    # (to whom, as everywhere in JupyterHub's API, another user's server looks absent).
    report = {"pages": 1, "connections": 0, "busy": False, "input_s": 0, "page_s": 0}
    for user, status in (("typist", 404), ("walker", 204)):
        sent = requests.post(
            f"{platform.url}/hub/api/gpuslice/presence/walker/",
            headers={"Authorization": f"token {platform.token(user)}"},
            json=report,
            timeout=30,
        )
        assert sent.status_code == status, (user, sent.status_code, sent.text)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages = {}
        for user in STUDENTS:
            pages[user] = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            login(pages[user], platform, user)
            open_notebook(pages[user], platform, user)
        closer, walker, typist = (pages[u] for u in STUDENTS)

        type_into_first_cell(typist, "y = 2")
        typist.keyboard.press("Shift+Enter")
        typist.wait_for_selector(".jp-Cell .jp-InputPrompt:has-text('[1]')", timeout=60_000)
        last_run = time.time()
        type_into_first_cell(walker, 'print("left open, kept")')  # edited, not saved, then nobody there
        walked = time.time()
        type_into_first_cell(closer, 'print("closed tab, kept")')
        closer.keyboard.press("Shift+Enter")
        closer.wait_for_selector(".jp-OutputArea-output:has-text('closed tab, kept')", timeout=60_000)
        closer.keyboard.press("Control+s")
        closer.wait_for_selector(".lm-TabBar-tab.jp-mod-dirty", state="detached", timeout=30_000)

        def wait_in_line(user: str) -> None:
            queued = admin_api(
                platform, token, "POST", f"/users/{user}/server", json={"gpu_memory": "4GiB", "wait": True}
            )
            assert queued.status_code in (201, 202), queued.text

        wait_in_line("w1")
        closer.close()  # its last beat says so: no page open
        closed = time.time()
        until(lambda: pages_reported(platform, "closer/") == 0, "the closed tab reported", 30, lambda: None)

        typed = {"at": 0.0}
        shot = {"taken": False}

        def typist_keeps_typing() -> None:
            """Reading and editing between runs: a key every 3 s."""
            if time.monotonic() - typed["at"] >= 3:
                typist.keyboard.type("#")
                typed["at"] = time.monotonic()
            if not shot["taken"] and walker.locator(".Toastify__toast >> text=You seem to be away").count():
                walker.wait_for_selector(".Toastify__toast >> text=Saved 1 open document", timeout=20_000)
                walker.wait_for_timeout(800)  # the toasts slide in
                walker.screenshot(path=str(SHOTS / "warning-saved-walker.png"))
                assert walker.title().startswith("GPU stops soon: ")  # in the tab strip too, after the save
                assert "official Jupyter news" not in walker.inner_text("body")
                home = walker_session.get(f"{platform.url}/hub/home", timeout=30).text
                assert "You seem to be away while others wait for a GPU" in home  # the hub's page says it too
                shot["taken"] = True

        def placed(*users: str) -> bool:
            holding = {k for k, _, _ in platform.ledger()}
            ready = admin_api(platform, token, "GET", "/users?state=ready").json()
            return all(f"{u}/" in holding for u in users) and {u["name"] for u in ready} >= set(users)

        def reclaimed(count: int) -> bool:
            return sum(stopped_by_reclaimer(platform, f"{u}/") for u in ("closer", "walker")) >= count

        # One waits: the one who left first goes first (the most overdue); the next waiter gets the other.
        until(lambda: reclaimed(1) and placed("w1"), "a slice for w1", 180, typist_keeps_typing)
        wait_in_line("w2")  # w1's new server, opened by nobody, is behind the one who left long ago
        until(lambda: reclaimed(2) and placed("w1", "w2"), "a slice for w2", 180, typist_keeps_typing)
        assert sorted(k for k, _, _ in platform.ledger()) == ["typist/", "w1/", "w2/"]
        assert shot["taken"], "the walker's JupyterLab never showed the warning"
        for user, left_at, timeout in (("closer", closed, 30), ("walker", walked, 60)):
            kinds = [k for k, _, _ in events(platform, f"{user}/")]
            assert kinds[-3:] == ["warned", "stopping", "stopped"], (user, kinds)
            stopping = next((m, c) for k, m, c in reversed(events(platform, f"{user}/")) if k == "stopping")
            assert "nobody there while others waited" in stopping[0], stopping
            assert stopping[1] >= left_at + timeout, (user, stopping[1] - left_at)  # never before its timeout

        # The typist, pausing between runs for longer than both timeouts while others waited, kept it.
        until(lambda: time.time() - last_run > 70, "a pause past both timeouts", 120, typist_keeps_typing)
        assert "warned" not in [k for k, _, _ in events(platform, "typist/")]
        typist.keyboard.press("Shift+Enter")
        typist.wait_for_selector(".jp-Cell .jp-InputPrompt:has-text('[2]')", timeout=60_000)

        for user in WAITERS:  # they are done: the slices are free for the next starts
            assert admin_api(platform, token, "DELETE", f"/users/{user}/server").status_code in (202, 204)
        until(lambda: [k for k, _, _ in platform.ledger()] == ["typist/"], "the waiters stopped", 120, lambda: None)
        walker.close()

        again = {
            u: browser.new_context(viewport={"width": 1280, "height": 800}).new_page() for u in ("closer", "walker")
        }
        for user, page in again.items():
            login(page, platform, user)
            start_again_in_the_browser(page, platform, user)
        # The reopened notebooks render their cells after the page: wait for them (an empty notebook never has them).
        again["walker"].wait_for_selector(".jp-Notebook .jp-InputArea >> text=left open, kept", timeout=60_000)
        again["closer"].wait_for_selector(".jp-Notebook .jp-InputArea >> text=closed tab, kept", timeout=60_000)
        assert 'print("left open, kept")' in again["walker"].inner_text(".jp-Notebook")  # saved by the warning
        assert 'print("closed tab, kept")' in again["closer"].inner_text(".jp-Notebook")
        assert "closed tab, kept" in again["closer"].inner_text(".jp-OutputArea")  # its output, saved with it
        try:
            notice = again["walker"].wait_for_selector(
                ".Toastify__toast >> text=by the GPU line's reclaimer", timeout=60_000
            )
        except Exception as exc:  # what the page was told, and what the ledger holds: the failure says why
            said = again["walker"].evaluate(
                "fetch(document.location.origin + '/hub/gpuslice/notice', {credentials: 'same-origin'})"
                ".then(r => r.status + ' ' + r.statusText).catch(e => String(e))"
            )
            body = again["walker"].evaluate(
                "fetch(document.location.origin + '/hub/gpuslice/notice', {credentials: 'same-origin'})"
                ".then(r => r.text()).catch(e => String(e))"
            )
            toasts = again["walker"].locator(".Toastify__toast").all_inner_texts()
            raise AssertionError(
                f"no stop notice: /hub/gpuslice/notice said {said} {body}; toasts {toasts};"
                f" walker's events {events(platform, 'walker/')}"
            ) from exc
        assert notice is not None and "What you had open is open again." in notice.inner_text()
        again["walker"].wait_for_timeout(800)
        again["walker"].screenshot(path=str(SHOTS / "reopened-walker.png"))
        again["walker"].reload()  # the stop's notice is shown once, whatever the page loads after
        again["walker"].wait_for_selector(".jp-Notebook", timeout=120_000)
        again["walker"].wait_for_timeout(3000)
        assert not again["walker"].locator(".Toastify__toast >> text=by the GPU line's reclaimer").count()
        browser.close()
