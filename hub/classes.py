"""Classes: a group of students from a roster file, with its GPU rules, in the settings file.

`gpuslice class add NAME roster.csv` reads the roster (a CSV with a ``username``
column, or user names in the first column), validates every name, and writes the
group to the settings file; JupyterHub loads it at the next `gpuslice up`.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import yaml

from hub.settings import SettingsError, from_mapping

_USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")


def read_roster(path: Path) -> list[str]:
    """User names from a roster CSV; raises SettingsError naming the file and line."""
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it ({exc.strerror})") from None
    if not rows:
        raise SettingsError(f"{path}: the roster is empty; put one user name per line")
    header = [cell.strip().lower() for cell in rows[0]]
    column, start = (header.index("username"), 1) if "username" in header else (0, 0)
    names: list[str] = []
    for line, row in enumerate(rows[start:], start=start + 1):
        if not row or not "".join(row).strip():
            continue
        if column >= len(row):
            raise SettingsError(f"{path}:{line}: no username in this row")
        name = row[column].strip().lower()  # JupyterHub compares user names in lower case
        if not _USERNAME.match(name):
            raise SettingsError(
                f"{path}:{line}: {row[column]!r} is not a user name (letters, digits, '.', '_', '@', '-')"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise SettingsError(f"{path}: the roster names nobody")
    return names


def add_class(settings_path: Path, name: str, members: list[str], rules: dict[str, Any]) -> dict[str, Any]:
    """Add or update group ``name`` in the settings file; returns the group as written."""
    raw: dict[str, Any] = {}
    if settings_path.exists():
        loaded = yaml.safe_load(settings_path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"{settings_path}: the top level must be a mapping of keys to values")
        raw = loaded
    groups = dict(raw.get("groups") or {})
    group = {**(groups.get(name) or {}), **{k: v for k, v in rules.items() if v is not None}, "members": members}
    groups[name] = group
    raw["groups"] = groups
    from_mapping(raw, str(settings_path))  # validate everything before writing anything
    settings_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return group
