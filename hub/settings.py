"""The platform's settings file (YAML), validated with messages that name the key.

Fixed keys (DESIGN.md): ``port``, ``data_dir``, ``admin_users``, ``gpus.simulate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spawner.gpus import parse_gpu_spec

DEFAULT_SIMULATE = "2x16GiB:T4,1x80GiB:H100"


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Settings:
    port: int = 8000
    data_dir: Path = Path("gpuslice-data")
    admin_users: tuple[str, ...] = ()
    simulate: str = DEFAULT_SIMULATE
    source: str = "built-in defaults"
    extra: dict[str, Any] = field(default_factory=dict)


def load(path: Path | None) -> Settings:
    """Read ``path`` (None: the defaults); raise SettingsError on anything malformed."""
    if path is None:
        return Settings()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: the top level must be a mapping of keys to values")
    return from_mapping(raw, str(path))


def from_mapping(raw: dict[str, Any], source: str) -> Settings:
    port = raw.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise SettingsError(f"{source}: port must be a number from 1 to 65535, not {port!r}")
    admins = raw.get("admin_users", [])
    if not isinstance(admins, list) or not all(isinstance(a, str) and a for a in admins):
        raise SettingsError(f"{source}: admin_users must be a list of user names")
    gpus = raw.get("gpus") or {}
    if not isinstance(gpus, dict):
        raise SettingsError(f"{source}: gpus must be a mapping (for example gpus: {{simulate: 2x16GiB:T4}})")
    simulate = str(gpus.get("simulate", DEFAULT_SIMULATE))
    try:
        parse_gpu_spec(simulate)
    except ValueError as exc:
        raise SettingsError(f"{source}: gpus.simulate: {exc}") from None
    data_dir = raw.get("data_dir", "gpuslice-data")
    if not isinstance(data_dir, str) or not data_dir:
        raise SettingsError(f"{source}: data_dir must be a folder path")
    known = {"port", "admin_users", "gpus", "data_dir"}
    return Settings(
        port=port,
        data_dir=Path(data_dir),
        admin_users=tuple(admins),
        simulate=simulate,
        source=source,
        extra={k: v for k, v in raw.items() if k not in known},
    )
