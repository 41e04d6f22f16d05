"""Who may launch an image: shared by the spawner (enforces) and the portal (explains)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from market.catalog import PLATFORM_ENV


def launch_blocker(*, deprecated: bool, groups: Iterable[str], user_groups: Iterable[str], admin: bool) -> str:
    """Why this user may not launch the image now ('' : they may)."""
    if deprecated:
        return "deprecated: no new servers"
    allowed = set(groups)
    if allowed and not admin and not allowed & set(user_groups):
        return f"only for the groups {', '.join(sorted(allowed))}"
    return ""


def local_prefix(local_path: str | None, platform_prefix: str) -> Path | None:
    """The Python environment a local server runs from (None: the image has none here)."""
    if not local_path:
        return None
    return Path(platform_prefix if local_path == PLATFORM_ENV else local_path)


def installed(prefix: Path | None) -> bool:
    return prefix is not None and (prefix / "bin" / "jupyterhub-singleuser").exists()
