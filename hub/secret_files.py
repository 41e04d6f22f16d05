"""Secrets kept in files (0600 on one machine, a Secret's key mounted as a file on Kubernetes)."""

from __future__ import annotations

from pathlib import Path


def first_line(path: Path, key: str, unreadable: str, empty: str, error: type[Exception], who: str = "") -> str:
    """The secret on ``path``'s first line, read when it is needed (never kept in settings or the environment).

    ``key`` names the setting that points at the file; ``unreadable`` and ``empty`` say what to
    do in each case; ``who`` (with its ": ") says whose secret it is. The secret is never quoted.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise error(f"{who}cannot read {key} {path} ({exc.strerror}): {unreadable}") from None
    if not lines or not lines[0]:
        raise error(f"{who}{key} {path} is empty: {empty}")
    return lines[0]
