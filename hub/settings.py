"""The platform's settings file (YAML), validated with messages that name the key.

One typed model (``Settings``, each field with its description); unknown keys are refused
with a "did you mean" suggestion. Group rules are parsed by spawner/quotas.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from spawner.gpus import parse_gpu_spec
from spawner.quotas import GroupRulesError, group_rules, unknown_keys_message

DEFAULT_SIMULATE = "2x16GiB:T4,1x80GiB:H100"


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and key."""


class Settings(BaseModel):
    """The platform's settings: ``gpuslice up``'s YAML, checked by ``from_mapping``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int = Field(default=8000, description="The proxy's public port: people open http://127.0.0.1:PORT/.")
    hub_port: int = Field(default=8081, description="The hub's own port (behind the proxy).")
    proxy_api_port: int = Field(default=8001, description="The proxy's REST API port.")
    portal_port: int = Field(
        default=8502, description="The portal gate's port (behind the proxy at /services/portal/)."
    )
    streamlit_port: int = Field(default=0, description="The Streamlit server behind the gate (0: any free port).")
    data_dir: Path = Field(default=Path("gpuslice-data"), description="Hub database, allocation ledger, users' homes.")
    admin_users: tuple[str, ...] = Field(default=(), description="Users who may see and stop every server.")
    simulate: str = Field(default=DEFAULT_SIMULATE, description="gpus.simulate: GPUs to simulate when NVML finds none.")
    source: str = Field(default="built-in defaults", description="Where these settings came from (a file path).")
    groups: tuple[dict[str, Any], ...] = Field(
        default=(), description="Classes: members and GPU rules (spawner/quotas.py)."
    )
    images: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Image id -> {path, description}.")
    isolation: str = Field(default="none", description="none (one account) or unix-users (an account per user).")
    idle_timeout: int = Field(default=3600, description="Seconds of inactivity before a server is stopped.")
    open_signup: bool = Field(default=True, description="Anyone may create an account at first login.")
    monitoring: dict[str, Any] = Field(
        default_factory=lambda: _monitoring({}, "defaults"),
        description="enabled, webhook_url, scrape_interval and the monitoring ports.",
    )
    market: dict[str, Any] = Field(
        default_factory=lambda: _market({}, "defaults"),
        description="url, models_root, images_catalog, models_catalog, proposals_per_hour (docs/markets.md).",
    )


# The keys a settings file may have: the fields, with the GPU spec under gpus.simulate.
TOP_LEVEL_KEYS = tuple(sorted({*Settings.model_fields, "gpus"} - {"simulate", "source"}))


DEFAULT_CONFIG = Path("gpuslice.yaml")  # read by `gpuslice up` and written by `gpuslice class add` without --config


def config_path(given: Path | None) -> Path | None:
    """The settings file to use: the one given, else ./gpuslice.yaml where it exists, else none (defaults)."""
    if given is not None:
        return given
    return DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None


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
    _refuse_unknown(raw, TOP_LEVEL_KEYS, source)
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
    )


def _groups(raw: Any, source: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: groups must map group names to their rules")
    try:
        return tuple({"name": str(name), **group_rules(str(name), rules)} for name, rules in raw.items())
    except GroupRulesError as exc:
        raise SettingsError(f"{source}: {exc}") from None


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
    _refuse_unknown(raw, ("enabled", "webhook_url", "scrape_interval", *MONITORING_PORTS), f"{source}: monitoring")
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
    _refuse_unknown(raw, tuple(MARKET_KEYS), f"{source}: market")
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


def _refuse_unknown(raw: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """A key we do not know is a typo or a feature this version lacks: say so, never ignore it."""
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise SettingsError(f"{where}: {unknown_keys_message(unknown, known)}")


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
