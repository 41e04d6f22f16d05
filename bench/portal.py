"""Portal sessions that keep opening its pages in a real browser while a class spawns.

Each session is a Chromium tab (Debian's ``chromium``, driven by Playwright) logged in
through the hub as an admin (who sees every server: the heaviest pages). A page counts
as answered when its title is shown and Streamlit reports the script run finished; one
that takes over a minute, or shows a traceback or an error message, is a failure.
Timings are kept apart for the idle portal (before the class) and for the portal while
the class spawns, so the figure that matters is their ratio on the same machine.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = {"": "Overview", "jobs": "Jobs", "gpus": "GPUs", "classes": "Classes"}
PAGE_TIMEOUT_MS = 60_000
DONE = "[data-testid='stApp'][data-test-script-state='notRunning']"


class PageError(RuntimeError):
    """The page answered with a traceback or an error instead of its content."""


@dataclass
class Phase:
    seconds: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        times = sorted(self.seconds)
        return {
            "pages": len(times),
            "p50_s": round(statistics.median(times), 2) if times else None,
            "p95_s": round(times[min(len(times) - 1, round(0.95 * (len(times) - 1)))], 2) if times else None,
            "max_s": round(times[-1], 2) if times else None,
            "failures": dict(self.failures),
        }


class PortalLoad:
    """``with PortalLoad(base, users): run the class`` keeps every session refreshing meanwhile."""

    def __init__(self, base: str, users: list[str], idle_rounds: int = 2) -> None:
        if not Path(CHROMIUM).exists():
            raise RuntimeError("portal sessions need Debian's chromium: scripts/setup installs it")
        self.base, self.users, self.idle_rounds = base, users, idle_rounds
        self.idle, self.during = Phase(), Phase()
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
        return {"sessions": len(self.users), "idle": idle, "during_class": during, "during_over_idle": ratio}

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

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                pages = await asyncio.gather(*(self._login(browser, user) for user in self.users))
                await asyncio.gather(*(self._rounds(page, self.idle, self.idle_rounds) for page in pages))
                self._ready.set()
                await asyncio.gather(*(self._rounds(page, self.during, None) for page in pages))
            finally:
                await browser.close()

    async def _login(self, browser: Any, user: str) -> Any:
        page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
        await page.goto(f"{self.base}/hub/login", timeout=PAGE_TIMEOUT_MS)
        await page.fill("#username_input", user)
        await page.fill("#password_input", "bench-password")
        await page.click("#login_submit")
        await page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_MS)
        return page

    async def _rounds(self, page: Any, phase: Phase, rounds: int | None) -> None:
        done = 0
        while (rounds is None and not self._stop.is_set()) or (rounds is not None and done < rounds):
            for path, title in PAGES.items():
                await self._open(page, path, title, phase)
                if rounds is None and self._stop.is_set():
                    return
            done += 1

    async def _open(self, page: Any, path: str, title: str, phase: Phase) -> None:
        began = time.perf_counter()
        try:
            await page.goto(f"{self.base}/services/portal/{path}", timeout=PAGE_TIMEOUT_MS)
            await page.wait_for_selector(f"h1:has-text('{title}')", timeout=PAGE_TIMEOUT_MS)
            await page.wait_for_selector(DONE, state="attached", timeout=PAGE_TIMEOUT_MS)
            if await page.locator("[data-testid='stException']").count():
                raise PageError("a traceback")
            if await page.locator("[data-testid='stAlertContentError']").count():
                raise PageError("an error message")  # e.g. the hub did not answer in time
        except PageError as exc:
            phase.failures[f"{title}: {exc}"] += 1
            return
        except Exception as exc:  # every failure counted by page and cause; the session goes on
            phase.failures[f"{title}: {type(exc).__name__}"] += 1
            return
        phase.seconds.append(time.perf_counter() - began)
