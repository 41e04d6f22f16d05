"""Words people read in the spawner's messages that pages finish in the reader's own terms. Pure code.

A time in a message is written as an instant in UTC (``2026-11-25T09:41:31Z``): the hub's
pages and JupyterLab turn it into the reader's clock and "in 4 minutes" in the browser
(hub/templates/gpuslice_times.html, spawner/lab), the portal with the reader's time zone
(portal/views.py ``times_in_words``). A message read elsewhere (the REST API, a log) still
says an unambiguous time.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def instant(timestamp: float) -> str:
    """Seconds since the epoch as the instant the pages rewrite: "2026-11-25T09:41:31Z"."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def place_words(position: int) -> str:
    """A place in line as people say it: "You are next in line.", "You are 3rd in line: 2 people are before you." """
    if position <= 1:
        return "You are next in line."
    before = position - 1
    return f"You are {ordinal(position)} in line: {before} {'person is' if before == 1 else 'people are'} before you."


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def counted(n: int, thing: str, things: str | None = None) -> str:
    """A number with its noun as people say it: "1 whole GPU", "2 whole GPUs", "1 request", "3 people"."""
    return f"{n} {thing if n == 1 else (things or thing + 's')}"
