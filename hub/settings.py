"""The platform's settings file (YAML), validated with messages that name the key.

One typed model (``Settings``, each field with its description); unknown keys are refused
with a "did you mean" suggestion. Group rules are parsed by spawner/quotas.py.
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spawner.gpus import parse_gpu_spec
from spawner.quotas import GroupRulesError, group_rules, unknown_keys_message
from spawner.shares import ShareError, parse_quantity

DEFAULT_SIMULATE = "2x16GiB:T4,1x80GiB:H100"


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and key."""


class NoticeMail(BaseModel):
    """How ``gpuslice usage --notices FOLDER --send`` mails the weekly idle notice (docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    smtp_smarthost: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+:[0-9]+$", description="host:port of the mail relay (submission: usually 587)."
    )
    smtp_from: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", description="Sender address of the notices.")
    address: str = Field(
        default="{user}@localhost",
        pattern=r"^[^@\s]*\{user\}[^@\s]*@[^@\s]+$",
        description="Each user's address, {user} replaced by the user name (e.g. {user}@students.example.org).",
    )
    starttls: bool = Field(
        default=False,
        description="STARTTLS before sending; the relay's certificate is checked (ca_file or the system's).",
    )
    ca_file: Path | None = Field(default=None, description="CA certificates of the relay (default: the system's).")
    username: str | None = Field(default=None, description="Log in to the relay (SMTP AUTH) as this user.")
    password_file: Path | None = Field(
        default=None,
        description="A file (mode 0600) holding the relay password: never in the settings or the environment.",
    )
    weekly: bool = Field(
        default=False,
        description="The platform mails last week's notices itself, once a week (hub/renewals.py): no cron needed.",
    )
    min_idle_hours: float = Field(
        default=2.0, ge=0, description="A user gets the weekly notice from this many GPU-hours held idle."
    )

    @model_validator(mode="after")
    def _login_over_tls(self) -> NoticeMail:
        if bool(self.username) != bool(self.password_file):
            raise ValueError("username and password_file go together (the password is read from the file)")
        if self.username and not self.starttls:
            raise ValueError("a login needs starttls: true, or the password would cross the network in clear")
        return self


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
    isolation: str = Field(
        default_factory=lambda: default_isolation(),
        description="unix-users (an account per user; the default as root) or none (every notebook runs as "
        "gpuslice's own account; the default otherwise).",
    )
    user_env: Path = Field(
        default=Path("/opt/gpuslice/user"),
        description="Under unix-users: the Python environment every account can read that notebooks run from.",
    )
    idle_timeout: int = Field(default=3600, description="Seconds of inactivity before a server is stopped.")
    gpu_idle_timeout: int = Field(
        default=900, description="While anyone waits for a GPU: seconds idle before a slice is reclaimed."
    )
    line_max_wait: int = Field(
        default=14400, description="Longest a request may wait in the GPU line (seconds); it is then told so."
    )
    open_signup: bool = Field(default=True, description="Anyone may create an account at first login.")
    admin_password_from: str = Field(
        default="",
        description='The admins\' first password: "file:PATH" (mode 0600) or "env:NAME"; empty: generated, shown once.',
    )
    smallest_slice: str = Field(
        default="256MiB",
        description="The smallest GPU slice a server may ask for; smaller ones are refused (CUDA needs about this).",
    )
    monitoring: dict[str, Any] = Field(
        default_factory=lambda: _monitoring({}, "defaults"),
        description="enabled, webhook_url, scrape_interval, the monitoring ports and oncall (an OnCall).",
    )
    market: dict[str, Any] = Field(
        default_factory=lambda: _market({}, "defaults"),
        description="url, models_root, images_catalog, models_catalog, proposals_per_hour (docs/markets.md).",
    )
    notice_mail: NoticeMail | None = Field(
        default=None, description="Mail the weekly idle notice (gpuslice usage --send); none: files only."
    )


# The keys a settings file may have: the fields, with the GPU spec under gpus.simulate.
TOP_LEVEL_KEYS = tuple(sorted({*Settings.model_fields, "gpus"} - {"simulate", "source"}))


DEFAULT_CONFIG = Path("gpuslice.yaml")  # read by `gpuslice up` and written by `gpuslice class add` without --config


def default_isolation() -> str:
    """As root, an account per user: otherwise every notebook would run as root (docs/security.md)."""
    return "unix-users" if os.geteuid() == 0 else "none"


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
        isolation=_choice(raw, "isolation", ("none", "unix-users"), default_isolation(), source),
        user_env=_user_env(raw, source),
        idle_timeout=_positive_int(raw, "idle_timeout", 3600, source),
        line_max_wait=_positive_int(raw, "line_max_wait", 14400, source),
        gpu_idle_timeout=_positive_int(raw, "gpu_idle_timeout", 900, source),
        open_signup=_bool(raw, "open_signup", True, source),
        admin_password_from=_password_source(raw, source),
        smallest_slice=_amount(raw, "smallest_slice", "256MiB", source),
        monitoring=_monitoring(raw.get("monitoring") or {}, source),
        market=_market(raw.get("market") or {}, source),
        notice_mail=_notice_mail(raw.get("notice_mail"), source),
    )


def _notice_mail(raw: Any, source: str) -> NoticeMail | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: notice_mail must be a mapping (smtp_smarthost, smtp_from, address)")
    try:
        return NoticeMail.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(f"{source}: notice_mail: {validation_problems(exc)}") from None


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


_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")  # Alertmanager's duration syntax, one part
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")  # Alertmanager's names


def duration_s(text: str) -> float:
    """Alertmanager's duration syntax (``15m``, ``1h30m``) in seconds; the one parser of it."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"must be a duration like 15m or 1h30m, not {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, not {value!r}")
    return value


class Contact(BaseModel):
    """Someone Alertmanager notifies: a person or a team, by webhook and/or email."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Who: a person or a team (letters, digits, _ . -).")
    webhook_url: str | None = Field(default=None, description="Alertmanager posts the alerts here (chat, pager).")
    webhook_url_file: Path | None = Field(
        default=None,
        description="A file holding the webhook URL (a mounted Secret): URLs often carry a token. "
        "Read when the Alertmanager config is written.",
    )
    email: str | None = Field(default=None, description="Alertmanager mails the alerts here (needs oncall.smtp_*).")

    _url = field_validator("webhook_url")(_http_url)

    @model_validator(mode="after")
    def _one_url(self) -> Contact:
        if self.webhook_url and self.webhook_url_file:
            raise ValueError("give webhook_url or webhook_url_file, not both")
        return self

    @property
    def reachable(self) -> bool:
        return bool(self.webhook_url or self.webhook_url_file or self.email)


class OnCall(BaseModel):
    """Who is paged, when, and who next (docs/operations.md). Empty: one webhook per severity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rotation: tuple[Contact, ...] = Field(default=(), description="First line: they take turns.")
    rotation_days: int = Field(default=7, ge=1, description="Days each first-line person is on call.")
    rotation_start: date = Field(default=date(2026, 1, 5), description="The day the rotation's first person starts.")
    second_line: Contact | None = Field(default=None, description="Paged when the first line does not acknowledge.")
    owner: Contact | None = Field(default=None, description="Paged when nobody acknowledges a critical alert.")
    escalate_after: str = Field(default="15m", description="Unacknowledged for this long: the second line is paged.")
    owner_after: str = Field(default="45m", description="Unacknowledged critical alert for this long: the owner.")
    business_days: str = Field(default="monday:friday", description="Days warnings are sent (Alertmanager weekdays).")
    business_hours: str = Field(default="08:00-18:00", description="Hours warnings are sent; outside they wait.")
    timezone: str = Field(default="UTC", description="Time zone of the rotation and business hours (IANA name).")
    critical_repeat: str = Field(default="1h", description="A firing critical alert is sent again this often.")
    warning_repeat: str = Field(default="12h", description="A firing warning is sent again this often.")
    group_interval: str = Field(default="1m", description="How soon an incident's changes (new, resolved) are sent.")
    deadman_url: str | None = Field(default=None, description="Receives the Watchdog heartbeat every minute.")
    deadman_url_file: Path | None = Field(default=None, description="A file holding deadman_url (a mounted Secret).")
    smtp_smarthost: str | None = Field(default=None, description="host:port of the mail relay for email contacts.")
    smtp_from: str | None = Field(default=None, description="Sender address of alert mails.")
    smtp_auth_username: str | None = Field(default=None, description="Alertmanager logs in to the relay as this.")
    smtp_auth_password_file: Path | None = Field(
        default=None, description="A file (a mounted Secret) holding that login's password; read with the URLs."
    )

    _deadman = field_validator("deadman_url")(_http_url)

    @field_validator("escalate_after", "owner_after", "critical_repeat", "warning_repeat", "group_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_s(value)  # refuses what Alertmanager would not read
        return value

    @field_validator("business_days")
    @classmethod
    def _days(cls, value: str) -> str:
        day = "|".join(WEEKDAYS)
        if not re.fullmatch(rf"({day})(:({day}))?", value):
            raise ValueError(f"must be a weekday or a range like monday:friday, not {value!r}")
        return value

    @field_validator("business_hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        if not re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-4]):[0-5][0-9]", value):
            raise ValueError(f"must be HH:MM-HH:MM like 08:00-18:00, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_deadman_url(self) -> OnCall:
        if self.deadman_url and self.deadman_url_file:
            raise ValueError("give deadman_url or deadman_url_file, not both")
        if bool(self.smtp_auth_username) != bool(self.smtp_auth_password_file):
            raise ValueError("smtp_auth_username and smtp_auth_password_file go together")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.rotation or self.second_line or self.owner or self.deadman_url or self.deadman_url_file)

    def contacts(self) -> tuple[Contact, ...]:
        return (*self.rotation, *(c for c in (self.second_line, self.owner) if c))


def validation_problems(exc: ValidationError) -> str:
    """A pydantic error in one line for people: "key.path: what is wrong; ..."."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def read_oncall(raw: Any, source: str) -> OnCall:
    """monitoring.oncall checked (gpuslice.yaml and the chart's values alike); SettingsError naming the key."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: monitoring.oncall must be a mapping (rotation, second_line, owner, ...)")
    try:
        oncall = OnCall.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(f"{source}: monitoring.oncall: {validation_problems(exc)}") from None
    mailed = [c.name for c in oncall.contacts() if c.email]
    if mailed and not (oncall.smtp_smarthost and oncall.smtp_from):
        raise SettingsError(
            f"{source}: monitoring.oncall: {', '.join(mailed)} should get email: set smtp_smarthost and smtp_from"
        )
    unreachable = [c.name for c in oncall.contacts() if not c.reachable]
    if unreachable:
        who = ", ".join(unreachable)
        raise SettingsError(f"{source}: monitoring.oncall: give {who} a webhook_url (or webhook_url_file) or an email")
    return oncall


# Prometheus and Alertmanager ask for basic auth as this user; the password is in a 0600 file
# (spawner.environ.MONITORING_PASSWORD_FILE) that only the platform's account can read.
MONITORING_USER = "gpuslice"

MONITORING_PORTS = {
    "exporter_port": 9400,
    "prometheus_port": 9090,
    "alertmanager_port": 9093,
    "node_exporter_port": 9100,
    "recorder_port": 9095,  # the incident recorder: Alertmanager's webhook (portal/recorder.py)
}


def _monitoring(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: monitoring must be a mapping (enabled, webhook_url, ports)")
    _refuse_unknown(
        raw, ("enabled", "webhook_url", "scrape_interval", "oncall", *MONITORING_PORTS), f"{source}: monitoring"
    )
    result: dict[str, Any] = {
        "enabled": _bool(raw, "enabled", True, f"{source}: monitoring"),
        "oncall": read_oncall(raw.get("oncall") or {}, source),
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


def _user_env(raw: dict[str, Any], source: str) -> Path:
    path = Path(str(raw.get("user_env", "/opt/gpuslice/user")))
    if not path.is_absolute():
        raise SettingsError(f"{source}: user_env must be an absolute folder path (such as /opt/gpuslice/user)")
    return path


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


def _password_source(raw: dict[str, Any], source: str) -> str:
    value = raw.get("admin_password_from", "")
    if not isinstance(value, str) or (value and not value.startswith(("file:", "env:"))):
        raise SettingsError(f'{source}: admin_password_from must be "file:PATH" or "env:NAME", not {value!r}')
    return value


def _amount(raw: dict[str, Any], key: str, fallback: str, source: str) -> str:
    value = raw.get(key, fallback)
    try:
        if not isinstance(value, str):
            raise ShareError(f"a {type(value).__name__} is not an amount of memory.")
        if parse_quantity(value) <= 0:
            raise ShareError(f"{value!r} is not an amount of memory above 0.")
    except ShareError as exc:
        raise SettingsError(f"{source}: {key}: {exc} Write for example 256MiB.") from None
    return value


def _bool(raw: dict[str, Any], key: str, fallback: bool, source: str) -> bool:
    value = raw.get(key, fallback)
    if not isinstance(value, bool):
        raise SettingsError(f"{source}: {key} must be true or false, not {value!r}")
    return value
