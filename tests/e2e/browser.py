"""Debian's Chromium driven by Playwright, logged in through the hub's login form."""

from playwright.sync_api import Page

from bench.portal import ARGS, CHROMIUM
from tests.e2e.platform import Platform

__all__ = ["ARGS", "CHROMIUM", "login"]


def login(page: Page, platform: Platform, user: str) -> None:
    page.goto(f"{platform.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "a-long-password")
    page.click("#login_submit")
    page.wait_for_load_state("networkidle")
