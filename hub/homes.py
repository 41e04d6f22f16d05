"""How much disk each user's home folder takes, for the HomeOverSize alert.

The machine's filesystems offer no per-user quota here (ext4 mounted without ``usrquota``,
no quota tools), so a home's size is watched instead of capped: a thread of the hub adds
up each home every few minutes (the blocks its files take, as ``du`` does, not following
links), and /hub/metrics serves the sizes beside each user's ``limits.home``
(hub/metrics.py ``HomeCollector``); Prometheus warns when a home stays over it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sizes import format_bytes

# The name under which the home's warning reaches the hub's templates and /hub/gpuslice/notice
# (JupyterHub.template_vars: a callable is called with the page's user).
HOME_NOTICE = "gpuslice_home_notice"
SYSTEM_PREFIX = "jupyter-"  # spawner/local.py's accounts under isolation unix-users


def folder_bytes(folder: Path) -> int:
    """Disk blocks taken by everything under ``folder`` (links not followed, unreadable parts skipped)."""
    total, todo = 0, [folder]
    while todo:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(Path(entry.path))
    return total


def homes(isolation: str, home_root: Path) -> dict[str, Path]:
    """user -> home folder: ``home_root/USER`` under isolation none, each account's home under unix-users."""
    if isolation == "unix-users":
        return {
            a.pw_name.removeprefix(SYSTEM_PREFIX): Path(a.pw_dir)
            for a in pwd.getpwall()
            if a.pw_name.startswith(SYSTEM_PREFIX) and Path(a.pw_dir).is_dir()
        }
    with contextlib.suppress(OSError):
        return {p.name: p for p in home_root.iterdir() if p.is_dir()}
    return {}


class HomeSizes:
    """The latest size of every home, added up again every ``interval_s`` by a daemon thread."""

    def __init__(self, find: Callable[[], dict[str, Path]], interval_s: float = 300.0) -> None:
        self.find, self.interval_s = find, interval_s
        self.sizes: dict[str, int] = {}
        self._stop = threading.Event()

    def refresh(self) -> dict[str, int]:
        self.sizes = {user: folder_bytes(path) for user, path in self.find().items()}
        return self.sizes

    def latest(self) -> dict[str, int]:
        """The sizes of the last walk, with each home made since then added up now (a new user's home is
        served at once, not up to ``interval_s`` later; listing the homes is cheap, walking them is not)."""
        known = self.sizes
        new = {user: folder_bytes(path) for user, path in self.find().items() if user not in known}
        if new:
            self.sizes = {**known, **new}
        return self.sizes

    def start(self) -> None:
        threading.Thread(target=self._run, name="home-sizes", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.refresh()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()


def over_size_words(used: int, limit: int) -> str | None:
    """What a user is told when their home takes more than ``limit`` bytes (None while it does not)."""
    if limit <= 0 or used <= limit:
        return None
    return (
        f"Your home folder takes {format_bytes(used)}, over the {format_bytes(limit)} each home should stay under. "
        "Delete what you no longer need (old checkpoints, datasets you can download again, ~/.cache); "
        "the platform's admins are told when a home stays over its size for 30 minutes."
    )


def home_notice(sizes: HomeSizes, limit_of: Callable[[str], int]) -> Callable[[Any], str | None]:
    """The template variable: the page's user's home warning, from the latest sizes (None: no user, or under)."""

    def notice(user: Any) -> str | None:
        name = getattr(user, "name", None)
        if not name or name not in sizes.sizes:
            return None
        return over_size_words(sizes.sizes[name], limit_of(name))

    return notice
