"""Classes: a group of students from a roster file, with its GPU rules, in the settings file.

`gpuslice class add NAME roster.csv` reads the roster (a CSV with a ``username``
column, or user names in the first column), validates every name, and writes the
group to the settings file; JupyterHub loads it at the next `gpuslice up`. The file is
edited round-trip (ruamel.yaml): its comments, order and quoting stay as they were.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from hub.settings import SettingsError, from_mapping

_USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
_BARE_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")


def require_unit(option: str, value: str | None) -> None:
    """A size on the command line needs its unit: a bare ``8`` would be 8 bytes."""
    if value is not None and _BARE_NUMBER.match(value):
        raise SettingsError(f"{option} {value}: give the size with its unit, for example {value.strip()}GiB")


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
    """Add or update group ``name`` in the settings file, keeping its comments; returns the group as written."""
    for key in ("max_slice", "budget"):
        require_unit(f"--{key.replace('_', '-')}", rules.get(key))
    yaml = YAML()  # round-trip: comments, key order and quotes survive
    yaml.indent(mapping=2, sequence=4, offset=2)
    raw: Any = CommentedMap()
    if settings_path.exists():
        try:
            raw = yaml.load(settings_path.read_text()) or CommentedMap()
        except YAMLError as exc:
            raise SettingsError(f"{settings_path}: not valid YAML ({exc}); fix it, nothing was written") from None
        if not isinstance(raw, dict):
            raise SettingsError(f"{settings_path}: the top level must be a mapping of keys to values")
    groups = raw.setdefault("groups", CommentedMap())
    if groups is None:
        groups = raw["groups"] = CommentedMap()
    group = groups.get(name)
    if group is None:
        group = groups[name] = CommentedMap()
    for key, value in rules.items():
        if value is not None:
            group[key] = value
    group["members"] = members
    from_mapping(_plain(raw), str(settings_path))  # validate everything before writing anything
    with settings_path.open("w") as out:
        yaml.dump(raw, out)
    written: dict[str, Any] = _plain(group)
    return written


def _plain(value: Any) -> Any:
    """ruamel's commented containers as plain dicts and lists (for validation and callers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
