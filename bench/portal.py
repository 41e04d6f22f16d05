"""Portal sessions that keep opening its pages in a real browser while a class spawns.

Each session is a Chromium tab (Debian's ``chromium``, driven by Playwright) logged in
through the hub as an admin (who sees every server: the heaviest pages). A page counts
as answered when its title is shown and Streamlit reports the script run finished; one
that takes over a minute, or shows a traceback or an error message, is a failure.
Timings are kept apart for the idle portal (before the class) and for the portal while
the class spawns, so the figure that matters is their ratio on the same machine.

The browsers stand in for the readers' own computers. Beside the platform on the same cores,
every Chromium process weighs as much as the hub or the portal, and three sessions loading pages
back to back outweighed the portal they measure and the class's servers (docs/load.md).
``browsers_apart`` runs them in a cgroup of their own (``gpuslice-bench/browsers``, the weight of
one process, as the servers' parent has): the readers' computers then cost the machine one share
however many processes they start.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spawner import cgroupfs
from spawner.cgroups import GiB, Limits

# Debian's Chromium headless shell: the browser engine without the desktop browser around it, what
# Playwright itself runs headless. A browser test's Chromium took about a third less CPU than with the
# full browser in its headless mode (tests/e2e/test_portal.py's tour of every page, process accounting).
CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = {"": "Overview", "servers": "Servers", "gpus": "GPUs", "classes": "Classes"}
TEACHING = {"teaching": "Teaching"}  # for teachers and admins
PAGE_TIMEOUT_MS = 60_000
# A session's first page starts its Streamlit session and, for the first of them, the portal's
# imports: measured apart (``first_page``), with more patience, so the rounds time warm pages.
FIRST_PAGE_TIMEOUT_MS = 180_000
SCRIPT_STATE_JS = "() => document.querySelector(\"[data-testid='stApp']\")?.dataset.testScriptState"
# Ends when Streamlit's script run has ended, or has ended for a moment: the Overview and Jobs
# pages rerun a fragment every half second, and on a busy machine the next run can start before
# a poll would see the pause between two.
SETTLED_JS = """() => new Promise(resolve => {
  const app = document.querySelector("[data-testid='stApp']");
  if (app.dataset.testScriptState === "notRunning") return resolve(true);
  new MutationObserver((records, observer) => {
    if (app.dataset.testScriptState === "notRunning" || records.some(r => r.oldValue === "notRunning")) {
      observer.disconnect();
      resolve(true);
    }
  }).observe(app, {attributes: true, attributeFilter: ["data-test-script-state"], attributeOldValue: true});
})"""
TRACEBACK = "[data-testid='stException']"
# What a reader sees first below the title: a metric, a table, a caption or a message.
FIRST_CONTENT = (
    "[data-testid='stMetric'], [data-testid='stDataFrame'], [data-testid='stTable'],"
    " [data-testid='stCaptionContainer'], [data-testid='stAlert']"
)
ERROR = "[data-testid='stAlertContentError']"


class PageError(RuntimeError):
    """The page answered with a traceback or an error instead of its content."""


@dataclass
class Phase:
    seconds: list[float] = field(default_factory=list)  # until the page's script run has ended
    painted: dict[str, list[float]] = field(default_factory=dict)  # per page: until its title and first content
    failures: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        times = sorted(self.seconds)
        return {
            "pages": len(times),
            "p50_s": round(statistics.median(times), 2) if times else None,
            "p95_s": _p95(times),
            "max_s": round(times[-1], 2) if times else None,
            "first_paint_p95_s": {title: _p95(sorted(t)) for title, t in self.painted.items()},
            "failures": dict(self.failures),
        }


def _p95(times: list[float]) -> float | None:
    return round(times[min(len(times) - 1, round(0.95 * (len(times) - 1)))], 2) if times else None


class PortalLoad:
    """``with PortalLoad(base, users): run the class`` keeps every session refreshing meanwhile."""

    def __init__(
        self,
        base: str,
        users: list[str],
        roles: dict[str, str] | None = None,
        idle_rounds: int = 2,
        browsers_apart: bool = False,
    ) -> None:
        """``roles``: each user's role ("admin", "teacher", "student"; default admin): first paints are kept
        per page and role, and teachers and admins open the Teaching page too. ``browsers_apart``: the
        browsers in a cgroup of their own (needs root and a cgroup filesystem)."""
        if not Path(CHROMIUM).exists():
            raise RuntimeError("portal sessions need Debian's chromium-headless-shell: scripts/setup installs it")
        # Where the browsers' cgroup goes (None: beside the platform), found once.
        self.browser_hierarchy = cgroupfs.detect() if browsers_apart else None
        if browsers_apart and self.browser_hierarchy is None:
            raise RuntimeError("browsers apart need root and a cgroup filesystem (v1 or v2); run without it")
        self.base, self.users, self.idle_rounds = base, users, idle_rounds
        self.roles = roles or dict.fromkeys(users, "admin")
        self.first, self.idle, self.during = Phase(), Phase(), Phase()
        self.first_reloads: list[str] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> PortalLoad:
        self._thread.start()
        self._ready.wait()
        if self._error:
            raise RuntimeError(f"portal sessions did not start: {self._error}") from self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def summary(self) -> dict[str, Any]:
        idle, during = self.idle.summary(), self.during.summary()
        ratio = None
        if idle["p95_s"] and during["p95_s"]:
            ratio = {"p50": round(during["p50_s"] / idle["p50_s"], 2), "p95": round(during["p95_s"] / idle["p95_s"], 2)}
        return {
            "sessions": len(self.users),
            "browsers": "beside the platform" if self.browser_hierarchy is None else "in a cgroup of their own",
            "first_page": self.first.summary() | {"reloaded": self.first_reloads},
            "idle": idle,
            "during_class": during,
            "during_over_idle": ratio,
        }

    def _main(self) -> None:
        try:
            asyncio.run(self._sessions())
        except BaseException as exc:  # reported by __enter__ or in the summary's failures
            self._error = exc
            self.during.failures[f"sessions: {type(exc).__name__}"] += 1
        finally:
            self._ready.set()

    async def _sessions(self) -> None:
        from playwright.async_api import async_playwright

        async with async_playwright() as p, _browser_program(self.browser_hierarchy) as program:
            browser = await p.chromium.launch(executable_path=program, args=ARGS)
            try:
                pages = await asyncio.gather(*(self._login(browser, user) for user in self.users))
                roles = [self.roles.get(user, "admin") for user in self.users]
                await asyncio.gather(*(self._first_page(page) for page in pages))
                sessions = list(zip(pages, roles, strict=True))
                await asyncio.gather(
                    *(self._rounds(page, role, self.idle, self.idle_rounds) for page, role in sessions)
                )
                self._ready.set()
                await asyncio.gather(*(self._rounds(page, role, self.during, None) for page, role in sessions))
            finally:
                await browser.close()

    async def _login(self, browser: Any, user: str) -> Any:
        page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
        await page.goto(f"{self.base}/hub/login", timeout=PAGE_TIMEOUT_MS)
        await page.fill("#username_input", user)
        await page.fill("#password_input", "bench-password")  # bench/classroom.py PASSWORD
        await page.click("#login_submit")
        await page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_MS)
        return page

    async def _rounds(self, page: Any, role: str, phase: Phase, rounds: int | None) -> None:
        done = 0
        pages = {**PAGES, **(TEACHING if role in ("teacher", "admin") else {})}
        while (rounds is None and not self._stop.is_set()) or (rounds is not None and done < rounds):
            for path, title in pages.items():
                await self._open(page, path, title, phase, role=role)
                if rounds is None and self._stop.is_set():
                    return
            done += 1

    async def _first_page(self, page: Any) -> None:
        """A session's first Overview: timed apart, and reloaded once, as a person would, if it fails.

        The reload's cause is kept (``first_page["reloaded"]``): CI twice saw one session's first
        page never finish while the other's took 3 s, and it could not be made to happen here.
        """
        failure = await self._open(page, "", "Overview", self.first, FIRST_PAGE_TIMEOUT_MS, count=False)
        if failure:
            self.first_reloads.append(failure)
            await self._open(page, "", "Overview", self.first, FIRST_PAGE_TIMEOUT_MS)

    async def _open(
        self,
        page: Any,
        path: str,
        title: str,
        phase: Phase,
        timeout_ms: float = PAGE_TIMEOUT_MS,
        count: bool = True,
        role: str = "admin",
    ) -> str:
        """Open a page and time it until its script run has ended; the failure ("" if none), counted unless told not."""
        began = time.perf_counter()
        step = "loading"
        try:
            await page.goto(f"{self.base}/services/portal/{path}", timeout=timeout_ms)
            step = "waiting for the title"  # or for what stands instead of it
            await page.wait_for_selector(f"h1:has-text('{title}'), {TRACEBACK}, {ERROR}", timeout=timeout_ms)
            step = "waiting for the first content"  # the title and the element after it: the first paint
            await page.wait_for_selector(FIRST_CONTENT, timeout=timeout_ms)
            painted = time.perf_counter() - began
            step = "waiting for the script run to end"
            await asyncio.wait_for(page.evaluate(SETTLED_JS), timeout_ms / 1000)
            for selector, what in ((TRACEBACK, "a traceback"), (ERROR, "an error message")):
                shown = page.locator(selector)
                if await shown.count():  # e.g. the hub did not answer in time
                    raise PageError(f"{what}: {(await shown.first.inner_text())[:100]}")
        except PageError as exc:
            failure = f"{title}: {exc}"
        except Exception as exc:  # every failure counted by page and cause; the session goes on
            failure = f"{title}: {type(exc).__name__} {step} ({await _what_it_shows(page)})"
        else:
            phase.seconds.append(time.perf_counter() - began)
            phase.painted.setdefault(f"{title} ({role})", []).append(painted)
            return ""
        if count:
            phase.failures[failure] += 1
        return failure


BROWSER_CGROUP_PARENT, BROWSER_CGROUP = "gpuslice-bench", "browsers"


@contextlib.asynccontextmanager
async def _browser_program(hierarchy: cgroupfs.Hierarchy | None) -> Any:
    """What Playwright starts as Chromium: Chromium itself, or (a ``hierarchy`` given) a launcher that first
    joins the browsers' cgroup there, which is emptied and removed when the block ends."""
    if hierarchy is None:
        yield CHROMIUM
        return
    cgroups = cgroupfs.Cgroups(hierarchy, parent=BROWSER_CGROUP_PARENT)
    # One share of the CPU (the default weight), memory and processes enough for a few sessions, every device.
    folders = cgroups.create(BROWSER_CGROUP, Limits(memory_bytes=16 * GiB, processes=4096), ["a"])
    try:
        with tempfile.TemporaryDirectory(prefix="gpuslice-browsers-") as folder:
            launcher = Path(folder) / "chromium"
            launcher.write_text(launcher_script([f / "cgroup.procs" for f in folders], CHROMIUM))
            launcher.chmod(0o755)
            yield str(launcher)
    finally:
        cgroups.remove(BROWSER_CGROUP)


def launcher_script(procs: Sequence[Path], program: str) -> str:
    """A shell script that writes its own PID into each ``cgroup.procs`` and then execs ``program`` with its
    arguments: exec keeps the PID, so the program itself joined, and every process it starts is born there."""
    joins = "".join(f"echo $$ > {shlex.quote(str(path))}\n" for path in procs)
    return f'#!/bin/sh\nset -e\n{joins}exec {shlex.quote(program)} "$@"\n'


async def _what_it_shows(page: Any) -> str:
    """Where the page is and its first words: what a failure report needs to be understood."""
    try:
        state = await page.evaluate(SCRIPT_STATE_JS)
        text = " ".join((await page.inner_text("body", timeout=2_000)).split())[:100]
        return f"at {page.url.split('/services/portal/')[-1] or 'the Overview'}, script {state}: {text!r}"
    except Exception as exc:  # a closed or navigating page
        return f"page unreadable: {type(exc).__name__}"
