"""Debian's Chromium driven by Playwright, logged in through the hub's login form."""

from playwright.sync_api import Page

from bench.portal import ARGS, CHROMIUM
from tests.e2e.platform import Platform

__all__ = ["ARGS", "CHROMIUM", "log_in", "login"]


def log_in(page: Page, base: str, user: str, password: str) -> None:
    """Through the hub's login form at ``base`` (the hub's public URL)."""
    page.goto(f"{base}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_load_state("networkidle")


def login(page: Page, platform: Platform, user: str) -> None:
    log_in(page, platform.url, user, "a-long-password")
