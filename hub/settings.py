"""The platform's settings file (YAML), validated with messages that name the key.

Fixed keys (DESIGN.md): ``port``, ``data_dir``, ``admin_users``, ``gpus.simulate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spawner.gpus import parse_gpu_spec
from spawner.shares import ShareError, parse_quantity

DEFAULT_SIMULATE = "2x16GiB:T4,1x80GiB:H100"


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Settings:
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    portal_port: int = 8502
    streamlit_port: int = 0
    data_dir: Path = Path("gpuslice-data")
    admin_users: tuple[str, ...] = ()
    simulate: str = DEFAULT_SIMULATE
    source: str = "built-in defaults"
    groups: tuple[dict[str, Any], ...] = ()
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    isolation: str = "none"
    idle_timeout: int = 3600
    open_signup: bool = True
    monitoring: dict[str, Any] = field(default_factory=lambda: _monitoring({}, "defaults"))
    market: dict[str, Any] = field(default_factory=lambda: _market({}, "defaults"))
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
    port = _port(raw, "port", 8000, source)
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
    known = {
        "port",
        "hub_port",
        "proxy_api_port",
        "admin_users",
        "gpus",
        "data_dir",
        "groups",
        "images",
        "isolation",
        "idle_timeout",
        "open_signup",
        "monitoring",
        "market",
    }
    return Settings(
        port=port,
        hub_port=_port(raw, "hub_port", 8081, source),
        proxy_api_port=_port(raw, "proxy_api_port", 8001, source),
        portal_port=_port(raw, "portal_port", 8502, source),
        streamlit_port=0 if raw.get("streamlit_port", 0) == 0 else _port(raw, "streamlit_port", 0, source),
        data_dir=Path(data_dir),
        admin_users=tuple(admins),
        simulate=simulate,
        source=source,
        groups=_groups(raw.get("groups") or {}, source),
        images=_images(raw.get("images") or {}, source),
        isolation=_choice(raw, "isolation", ("none", "unix-users"), "none", source),
        idle_timeout=_positive_int(raw, "idle_timeout", 3600, source),
        open_signup=_bool(raw, "open_signup", True, source),
        monitoring=_monitoring(raw.get("monitoring") or {}, source),
        market=_market(raw.get("market") or {}, source),
        extra={k: v for k, v in raw.items() if k not in known},
    )


GROUP_KEYS = {"members", "max_slice", "max_gpus", "budget", "servers_per_user", "images"}


def _groups(raw: Any, source: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: groups must map group names to their rules")
    groups = []
    for name, rules in raw.items():
        rules = rules or {}
        where = f"{source}: groups.{name}"
        if not isinstance(rules, dict):
            raise SettingsError(f"{where} must be a mapping of rules")
        unknown = set(rules) - GROUP_KEYS
        if unknown:
            raise SettingsError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; use {', '.join(sorted(GROUP_KEYS))}"
            )
        for key in ("max_slice", "budget"):
            if rules.get(key) is not None:
                try:
                    parse_quantity(str(rules[key]))
                except ShareError as exc:
                    raise SettingsError(f"{where}.{key}: {exc}") from None
        for key in ("max_gpus", "servers_per_user"):
            value = rules.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise SettingsError(f"{where}.{key} must be a whole number, 0 or more")
        members = rules.get("members", [])
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise SettingsError(f"{where}.members must be a list of user names")
        groups.append({"name": str(name), **rules, "members": members})
    return tuple(groups)


def _images(raw: Any, source: str) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: images must map image ids to {{path, description}}")
    images = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
            raise SettingsError(f"{source}: images.{name} needs a path (a Python environment prefix)")
        images[str(name)] = dict(spec)
    return images


MONITORING_PORTS = {
    "exporter_port": 9400,
    "prometheus_port": 9090,
    "alertmanager_port": 9093,
    "node_exporter_port": 9100,
}


def _monitoring(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: monitoring must be a mapping (enabled, webhook_url, ports)")
    unknown = set(raw) - {"enabled", "webhook_url", "scrape_interval", *MONITORING_PORTS}
    if unknown:
        raise SettingsError(f"{source}: monitoring: unknown key(s) {', '.join(sorted(unknown))}")
    result: dict[str, Any] = {
        "enabled": _bool(raw, "enabled", True, f"{source}: monitoring"),
        "webhook_url": raw.get("webhook_url"),
        "scrape_interval": str(raw.get("scrape_interval", "15s")),
    }
    for key, fallback in MONITORING_PORTS.items():
        result[key] = _port(raw, key, fallback, f"{source}: monitoring")
    if result["webhook_url"] is not None and not str(result["webhook_url"]).startswith(("http://", "https://")):
        raise SettingsError(f"{source}: monitoring.webhook_url must be an http(s) URL")
    return result


CATALOGS = Path(__file__).parents[1] / "images"
MARKET_KEYS = {"url", "models_root", "images_catalog", "models_catalog", "proposals_per_hour"}


def _market(raw: Any, source: str) -> dict[str, Any]:
    """url ('' : a SQLite file in data_dir), models_root ('' : data_dir/models), catalogs, rate limit."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: market must be a mapping ({', '.join(sorted(MARKET_KEYS))})")
    unknown = set(raw) - MARKET_KEYS
    if unknown:
        raise SettingsError(f"{source}: market: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("url", "models_root", "images_catalog", "models_catalog"):
        if not isinstance(raw.get(key, ""), str):
            raise SettingsError(f"{source}: market.{key} must be text")
    return {
        "url": raw.get("url", ""),
        "models_root": raw.get("models_root", ""),
        "images_catalog": raw.get("images_catalog") or str(CATALOGS / "catalog.yaml"),
        "models_catalog": raw.get("models_catalog") or str(CATALOGS / "models.yaml"),
        "proposals_per_hour": _positive_int(raw, "proposals_per_hour", 3, f"{source}: market"),
    }


def market_url(settings: Settings) -> str:
    return str(settings.market["url"]) or f"sqlite:///{(settings.data_dir / 'market.sqlite').absolute()}"


def models_root(settings: Settings) -> Path:
    return Path(settings.market["models_root"] or settings.data_dir / "models").absolute()


def _port(raw: dict[str, Any], key: str, fallback: int, source: str) -> int:
    value = raw.get(key, fallback)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise SettingsError(f"{source}: {key} must be a number from 1 to 65535, not {value!r}")
    return value


def _choice(raw: dict[str, Any], key: str, allowed: tuple[str, ...], fallback: str, source: str) -> str:
    value = raw.get(key, fallback)
    if value not in allowed:
        raise SettingsError(f"{source}: {key} must be one of {', '.join(allowed)}, not {value!r}")
    return str(value)


def _positive_int(raw: dict[str, Any], key: str, fallback: int, source: str) -> int:
    value = raw.get(key, fallback)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingsError(f"{source}: {key} must be a whole number of seconds above 0, not {value!r}")
    return value


def _bool(raw: dict[str, Any], key: str, fallback: bool, source: str) -> bool:
    value = raw.get(key, fallback)
    if not isinstance(value, bool):
        raise SettingsError(f"{source}: {key} must be true or false, not {value!r}")
    return value
