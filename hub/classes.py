"""Classes: a group of students from a roster file, with its GPU rules, in the settings file.

`gpuslice class add NAME roster.csv` reads the roster (a CSV with a ``username``
column, or user names in the first column; a ``role`` column marks teachers), validates
every name (the login page's alphabet, hub/logins.py), and writes the group to the settings
file, edited round-trip (ruamel.yaml): its comments, order and quoting stay as they were.
A hub that runs gets the class at once through its classes API (hub/classes_api.py, with
the gpuslice-cli service's token from the data folder): nobody's server stops; a hub that
does not run takes it from the file at its start. `gpuslice class remove NAME` takes a
class out of both.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any, NamedTuple

import requests
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from hub.logins import name_problem, normalize_name
from hub.settings import Settings, SettingsError, from_mapping

CLI_SERVICE = "gpuslice-cli"  # hub/classes_api.py's service for this command (its token is a file in data_dir)
TEACHER_ROLES = ("teacher", "instructor", "ta")
_BARE_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")


def require_unit(option: str, value: str | None) -> None:
    """A size on the command line needs its unit: a bare ``8`` would be 8 bytes."""
    if value is not None and _BARE_NUMBER.match(value):
        raise SettingsError(f"{option} {value}: give the size with its unit, for example {value.strip()}GiB")


class Roster(NamedTuple):
    members: list[str]
    teachers: list[str]


def user_name(text: str, where: str) -> str:
    """``text`` as the login page normalizes it; SettingsError (``where``: the file and line, or the option)
    when it is not a user name."""
    name = normalize_name(text)
    problem = name_problem(name)
    if problem:
        raise SettingsError(f"{where}: {text.strip()!r} is not a user name: {problem}")
    return name


def user_names(text: str, where: str) -> list[str]:
    """Comma-separated user names (``--teachers tina,tom``)."""
    return [user_name(part, where) for part in text.split(",") if part.strip()]


def read_roster(path: Path) -> Roster:
    """User names from a roster CSV, teachers apart (a ``role`` column saying ``teacher``, ``instructor``
    or ``ta``); raises SettingsError naming the file and line."""
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it ({exc.strerror})") from None
    if not rows:
        raise SettingsError(f"{path}: the roster is empty; put one user name per line")
    header = [cell.strip().lower() for cell in rows[0]]
    column, start = (header.index("username"), 1) if "username" in header else (0, 0)
    role = header.index("role") if start and "role" in header else None
    roster = Roster([], [])
    for line, row in enumerate(rows[start:], start=start + 1):
        if not row or not "".join(row).strip():
            continue
        if column >= len(row):
            raise SettingsError(f"{path}:{line}: no username in this row")
        name = user_name(row[column], f"{path}:{line}")
        teacher = role is not None and role < len(row) and row[role].strip().lower() in TEACHER_ROLES
        names = roster.teachers if teacher else roster.members
        if name not in names:
            names.append(name)
    if not roster.members and not roster.teachers:
        raise SettingsError(f"{path}: the roster names nobody")
    return roster


def add_class(
    settings_path: Path, name: str, members: list[str], rules: dict[str, Any], teachers: list[str] | None = None
) -> dict[str, Any]:
    """Add or update group ``name`` in the settings file, keeping its comments; returns the group as written.

    ``teachers``: replace the class's teachers (None: keep those written)."""
    for key in ("max_slice", "budget"):
        require_unit(f"--{key.replace('_', '-')}", rules.get(key))
    hold = rules.get("max_hold")
    if hold is not None and _BARE_NUMBER.match(str(hold)):
        raise SettingsError(f"--max-hold {hold}: give the duration with its unit, for example {hold.strip()}h")
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
        # A comment after the last class belongs to what follows it: it stays after the new one.
        after = _take_trailing(groups)
        group = groups[name] = CommentedMap()
    else:
        after = None
    for key, value in rules.items():
        if value is not None:
            group[key] = value
    group["members"] = CommentedSeq(members)
    if teachers is not None:
        group["teachers"] = CommentedSeq(teachers)
    last = group["teachers"] if teachers else group["members"]
    if after is not None and last:
        last.ca.items[len(last) - 1] = [after, None]
    from_mapping(_plain(raw), str(settings_path))  # validate everything before writing anything
    with settings_path.open("w") as out:
        yaml.dump(raw, out)
    written: dict[str, Any] = _plain(group)
    return written


def _take_trailing(node: Any) -> Any:
    """Detach the comment ruamel keeps after a mapping's last value (a comment before the next key out)."""
    if isinstance(node, CommentedMap) and node:
        last = list(node.keys())[-1]
        inner = _take_trailing(node[last])
        if inner is not None:
            return inner
        item = node.ca.items.get(last)
        if item and len(item) > 2 and item[2] is not None:
            token, item[2] = item[2], None
            return token
    elif isinstance(node, CommentedSeq) and node:
        inner = _take_trailing(node[-1])
        if inner is not None:
            return inner
        item = node.ca.items.get(len(node) - 1)
        if item and item[0] is not None:
            token, item[0] = item[0], None
            return token
    return None


def remove_class(settings_path: Path, name: str) -> bool:
    """Take group ``name`` out of the settings file, keeping its comments; whether it was there."""
    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    if not settings_path.exists():
        return False
    try:
        raw = yaml.load(settings_path.read_text()) or CommentedMap()
    except YAMLError as exc:
        raise SettingsError(f"{settings_path}: not valid YAML ({exc}); fix it, nothing was written") from None
    groups = raw.get("groups") if isinstance(raw, dict) else None
    if not groups or name not in groups:
        return False
    after = _take_trailing(groups) if list(groups.keys())[-1] == name else None
    del groups[name]
    if after is not None and groups:
        last = groups[list(groups.keys())[-1]]
        key = list(last.keys())[-1] if isinstance(last, CommentedMap) and last else None
        if key is not None:
            last.ca.items[key] = [None, None, after, None]
    from_mapping(_plain(raw), str(settings_path))
    with settings_path.open("w") as out:
        yaml.dump(raw, out)
    return True


HUB_HAS_IT = "the running hub has it now (nobody's server was stopped)"


def tell_running_hub(settings: Settings, body: dict[str, Any], timeout_s: float = 30) -> str:
    """Ask the running hub to make a class change now; what happened, in words (no hub: said so, no error)."""
    token_file = settings.data_dir / f"{CLI_SERVICE}-hub-token"
    url = f"http://127.0.0.1:{settings.hub_port}/hub/api/gpuslice/classes"
    if not token_file.exists():
        return "no hub has run with these settings yet: `gpuslice up` takes the class from the file"
    try:
        response = requests.post(
            url, json=body, headers={"Authorization": f"token {token_file.read_text().strip()}"}, timeout=timeout_s
        )
    except requests.RequestException:
        return "no hub is running now: the next `gpuslice up` takes the change from the file"
    if response.status_code != 200:
        try:
            why = response.json().get("message", response.reason)
        except ValueError:
            why = response.reason
        raise SettingsError(f"the running hub refused the change (HTTP {response.status_code}): {why}")
    return HUB_HAS_IT


def _plain(value: Any) -> Any:
    """ruamel's commented containers as plain dicts and lists (for validation and callers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
