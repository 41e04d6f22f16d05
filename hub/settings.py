"""The platform's settings: one typed model for every deployment, with each default and rule once.

``Platform`` holds what every deployment shares (admins, classes and their GPU rules, the
idle culler's and the GPU reclaimer's timeouts, sign-up) with their defaults and the rules
between them. Three spellings read it:

* ``Settings``: gpuslice.yaml, the single machine (snake_case keys; ``load``);
* ``hub.kube_values.KubeValues``: the chart's rendered values (camelCase keys);
* ``hub.kube_values.Z2jhValues``: Zero to JupyterHub's ``custom.gpuslice`` and its ``cull.timeout``.

A key nobody knows (a typo, or a feature this version lacks) is refused with the likely fix;
a wrong value names its key and says what to write (spawner/checked.py). Group rules are
``spawner.quotas.GroupRules``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from sizes import quantity_text
from spawner import environ
from spawner.cgroups import LimitsError, parse_settings_limits
from spawner.checked import (
    Amount,
    Checked,
    Count,
    Flag,
    Port,
    PortOrZero,
    PositiveInt,
    Seconds,
    Text,
    UserNames,
    one_of,
    problems,
    unknown_keys_message,
)
from spawner.gpus import DEFAULT_SIMULATE as DEFAULT_SIMULATE
from spawner.gpus import parse_gpu_spec
from spawner.line_timeouts import (
    GPU_IDLE_TIMEOUT_S,
    GPU_LEFT_TIMEOUT_S,
    GPU_NO_INPUT_TIMEOUT_S,
    GPU_RELEASE_TIMEOUT_S,
    LINE_MAX_WAIT_S,
)
from spawner.quotas import GroupRules, GroupRulesError, classes, read_groups
from spawner.shares import DEFAULT_SMALLEST_SLICE

CULLER_TIMEOUT_S = 3600  # the idle culler stops a server idle this long (every deployment's default)


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and key."""


def _groups(raw: Any) -> tuple[GroupRules, ...]:
    try:
        return read_groups(raw or {})
    except GroupRulesError as exc:
        raise ValueError(str(exc)) from None


class Platform(Checked):
    """What every deployment shares, each default and each rule written once, here."""

    admin_users: UserNames = Field(default=(), description="Users who may see and stop every server.")
    groups: tuple[GroupRules, ...] = Field(
        default=(),
        description="Classes: members, teachers and GPU rules (spawner/quotas.py); a group named default "
        "holds the rules of users in no other group.",
    )
    idle_timeout: Seconds = Field(
        default=CULLER_TIMEOUT_S, description="Seconds of inactivity before the idle culler stops a server."
    )
    gpu_idle_timeout: Seconds = Field(
        default=GPU_IDLE_TIMEOUT_S,
        description="While anyone waits for a GPU: seconds idle before a slice is reclaimed (below the idle timeout).",
    )
    gpu_left_timeout: Seconds = Field(
        default=GPU_LEFT_TIMEOUT_S,
        description="While anyone waits for a GPU: seconds after the last JupyterLab page of a server closed, "
        "nothing of it used since, before its slice is reclaimed (docs/platform.md#presence).",
    )
    gpu_no_input_timeout: Seconds = Field(
        default=GPU_NO_INPUT_TIMEOUT_S,
        description="While anyone waits for a GPU: seconds without input in a JupyterLab page left open, nothing "
        "used, before its slice is reclaimed (at least the left timeout).",
    )
    gpu_release_timeout: Seconds = Field(
        default=GPU_RELEASE_TIMEOUT_S,
        description="Seconds after its owner left before a slice is released also when nobody waits (above the "
        "no-input timeout, below the idle timeout).",
    )
    open_signup: Annotated[Flag, WithJsonSchema({"type": ["boolean", "null"]})] = Field(
        default=True,
        description="Anyone may create an account at first login; unset: only where no class is configured.",
    )

    trusted_proxies: tuple[str, ...] = Field(
        default=(),
        description="Addresses or networks (10.0.0.0/8) of proxies in front of the hub's proxy (an ingress, a load "
        "balancer): failed logins count for the client behind them (loopback always does; docs/platform.md#logins).",
    )

    @field_validator("groups", mode="before")
    @classmethod
    def _read_groups(cls, raw: Any) -> tuple[GroupRules, ...]:
        return _groups(raw)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, raw: Any) -> tuple[str, ...]:
        if not isinstance(raw, list | tuple) or not all(isinstance(entry, str) for entry in raw):
            raise ValueError("must be a list of addresses or networks, such as [10.0.0.0/8]")
        for entry in raw:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"must be addresses or networks: {entry!r} is neither (write 10.0.0.0/8)") from None
        return tuple(raw)

    @model_validator(mode="before")
    @classmethod
    def _signup_closed_with_a_class(cls, data: Any) -> Any:
        """Unset (or null): open only where no class is configured; a second account then gets no class's room."""
        if isinstance(data, dict):
            key = cls.model_fields["open_signup"].alias or "open_signup"
            if data.get(key, data.get("open_signup")) is None:
                groups = data.get(cls.model_fields["groups"].alias or "groups", data.get("groups"))
                try:
                    has_class = bool(classes(_groups(groups)))
                except ValueError:
                    return data  # the groups' own validator says what is wrong with them
                data = {
                    **{k: v for k, v in data.items() if k not in (key, "open_signup")},
                    "open_signup": not has_class,
                }
        return data

    @model_validator(mode="after")
    def _reclaiming_before_culling(self) -> Platform:
        if self.gpu_idle_timeout >= self.idle_timeout:
            gpu, idle = (type(self).model_fields[f].alias or f for f in ("gpu_idle_timeout", "idle_timeout"))
            raise ValueError(
                f"{gpu} ({self.gpu_idle_timeout} s) must be below {idle} ({self.idle_timeout} s): the idle culler"
                f" would stop the server first and nothing would be reclaimed for the GPU line; lower {gpu} or"
                f" raise {idle}"
            )
        return self

    @model_validator(mode="after")
    def _left_then_released_then_culled(self) -> Platform:
        """gpu_left_timeout <= gpu_no_input_timeout < gpu_release_timeout, and a release set below idle_timeout,
        each said with why."""
        left, quiet, release, idle = (
            type(self).model_fields[f].alias or f
            for f in ("gpu_left_timeout", "gpu_no_input_timeout", "gpu_release_timeout", "idle_timeout")
        )
        if self.gpu_no_input_timeout < self.gpu_left_timeout:
            raise ValueError(
                f"{quiet} ({self.gpu_no_input_timeout} s) must be at least {left} ({self.gpu_left_timeout} s): a"
                f" page left open may have someone reading at it, a closed one has nobody; raise {quiet} or lower"
                f" {left}"
            )
        if self.gpu_release_timeout <= self.gpu_no_input_timeout:
            raise ValueError(
                f"{release} ({self.gpu_release_timeout} s) must be above {quiet} ({self.gpu_no_input_timeout} s):"
                f" a slice whose owner left goes to waiting classmates first and is released for everyone later;"
                f" raise {release} or lower {quiet}"
            )
        # The default release after a short idle_timeout is moot (the culler is first), not a mistake.
        if self.gpu_release_timeout >= self.idle_timeout and "gpu_release_timeout" in self.model_fields_set:
            raise ValueError(
                f"{release} ({self.gpu_release_timeout} s) must be below {idle} ({self.idle_timeout} s): the idle"
                f" culler would stop the server first; lower {release} or raise {idle}"
            )
        return self

    def signup_words(self) -> str:
        """Whether a new name may sign up, and why (the startup banner and the docs say it so)."""
        if self.open_signup:
            return "any other new name sets its own password at first login (open_signup: true)"
        because = ", the default with a class; an admin or an invite adds a name" if classes(self.groups) else ""
        return f"nobody else can sign up (open_signup: false{because})"


class NoticeMail(Checked):
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


class Contact(Checked):
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


class OnCall(Checked):
    """Who is paged, when, and who next (docs/operations.md). Empty: one webhook per severity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rotation: tuple[Contact, ...] = Field(default=(), description="First line: they take turns.")
    rotation_days: int = Field(default=7, ge=1, description="Days each first-line person is on call.")
    rotation_start: date = Field(default=date(2026, 1, 5), description="The day the rotation's first person starts.")
    second_line: Contact | None = Field(default=None, description="Paged when the first line does not acknowledge.")
    owner: Contact | None = Field(default=None, description="Paged when nobody acknowledges a critical alert.")
    first_page_after: str = Field(
        default="30s",
        description="An alert's first page waits this long, so that its cause (NodeDown, GpuExporterDown), which"
        " another rule group may fire a few seconds later, inhibits it instead of paging alongside it.",
    )
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

    @field_validator(
        "first_page_after", "escalate_after", "owner_after", "critical_repeat", "warning_repeat", "group_interval"
    )
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

    @model_validator(mode="after")
    def _everyone_reachable(self) -> OnCall:
        mailed = [c.name for c in self.contacts() if c.email]
        if mailed and not (self.smtp_smarthost and self.smtp_from):
            raise ValueError(f"{', '.join(mailed)} should get email: set smtp_smarthost and smtp_from")
        unreachable = [c.name for c in self.contacts() if not c.reachable]
        if unreachable:
            raise ValueError(f"give {', '.join(unreachable)} a webhook_url (or webhook_url_file) or an email")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.rotation or self.second_line or self.owner or self.deadman_url or self.deadman_url_file)

    def contacts(self) -> tuple[Contact, ...]:
        return (*self.rotation, *(c for c in (self.second_line, self.owner) if c))


def read_oncall(raw: Any, source: str) -> OnCall:
    """monitoring.oncall checked (gpuslice.yaml and the chart's values alike); SettingsError naming the key."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: monitoring.oncall must be a mapping (rotation, second_line, owner, ...)")
    try:
        return OnCall.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(f"{source}: {problems(exc, 'monitoring.oncall')}") from None


# Prometheus and Alertmanager ask for basic auth as this user; the password is in a 0600 file
# (spawner.environ.MONITORING_PASSWORD_FILE) that only the platform's account can read.
MONITORING_USER = "gpuslice"


class ImageEnv(Checked):
    """images.ID: a Python environment notebooks may run from (the single machine's image market)."""

    path: str = Field(description="The environment's prefix (its bin/python runs the server).")
    description: str = Field(default="", description="What it holds, for the spawn form.")

    @model_validator(mode="before")
    @classmethod
    def _a_path(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise ValueError("needs a path (a Python environment prefix)")
        return raw


class Monitoring(Checked):
    """monitoring: the exporter, Prometheus and Alertmanager started by `gpuslice up` (docs/monitoring.md)."""

    enabled: Flag = Field(default=True, description="Start monitoring where Prometheus is installed.")
    webhook_url: str | None = Field(default=None, description="Alertmanager posts every alert here.")
    scrape_interval: Text = Field(default="15s", description="How often Prometheus scrapes.")
    exporter_port: Port = Field(default=9400, description="The GPU exporter's port.")
    prometheus_port: Port = Field(default=9090, description="Prometheus' port.")
    alertmanager_port: Port = Field(default=9093, description="Alertmanager's port.")
    node_exporter_port: Port = Field(default=9100, description="node-exporter's port.")
    recorder_port: Port = Field(default=9095, description="The incident recorder's port (Alertmanager's webhook).")
    oncall: OnCall = Field(default_factory=OnCall, description="Who is paged, when, and who next.")

    @field_validator("webhook_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        if value is not None and not str(value).startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("oncall", mode="before")
    @classmethod
    def _oncall_mapping(cls, raw: Any) -> Any:
        if raw is None:
            return {}
        if not isinstance(raw, dict | OnCall):
            raise ValueError("must be a mapping (rotation, second_line, owner, ...)")
        return raw


CATALOGS = Path(__file__).parents[1] / "images"


class Market(Checked):
    """market: where the image and model markets keep their data (docs/markets.md)."""

    url: Text = Field(default="", description="SQLAlchemy URL ('': a SQLite file in data_dir).")
    models_root: Text = Field(default="", description="The model files' folder ('': data_dir/models).")
    images_catalog: Text = Field(default=str(CATALOGS / "catalog.yaml"), description="The image market's seed.")
    models_catalog: Text = Field(default=str(CATALOGS / "models.yaml"), description="The model market's seed.")
    proposals_per_hour: PositiveInt = Field(default=3, description="Model proposals one user may make per hour.")

    @field_validator("images_catalog", "models_catalog", mode="before")
    @classmethod
    def _default_when_empty(cls, value: Any, info: Any) -> Any:
        return value or cls.model_fields[info.field_name].default


def _default_isolation() -> str:
    return default_isolation()


class Settings(Platform):
    """gpuslice.yaml: the single-machine platform's settings, read by ``load``."""

    extra_keys = ("gpus",)  # gpus.simulate is read into simulate
    not_keys = ("simulate", "source")

    port: Port = Field(default=8000, description="The proxy's public port: people open http://127.0.0.1:PORT/.")
    hub_port: Port = Field(default=8081, description="The hub's own port (behind the proxy).")
    proxy_api_port: Port = Field(default=8001, description="The proxy's REST API port.")
    portal_port: Port = Field(
        default=8502, description="The portal gate's port (behind the proxy at /services/portal/)."
    )
    streamlit_port: PortOrZero = Field(
        default=0, description="The Streamlit server behind the gate (0: any free port)."
    )
    data_dir: Path = Field(default=Path("gpuslice-data"), description="Hub database, allocation ledger, users' homes.")
    simulate: str = Field(default=DEFAULT_SIMULATE, description="gpus.simulate: GPUs to simulate when NVML finds none.")
    source: str = Field(default="built-in defaults", description="Where these settings came from (a file path).")
    images: dict[str, ImageEnv] = Field(default_factory=dict, description="Image id -> {path, description}.")
    isolation: one_of("none", "unix-users") = Field(  # type: ignore[valid-type]
        default_factory=_default_isolation,
        description="unix-users (an account per user; the default as root) or none (every notebook runs as "
        "gpuslice's own account; the default otherwise).",
    )
    user_env: Path = Field(
        default=Path("/opt/gpuslice/user"),
        description="Under unix-users: the Python environment every account can read that notebooks run from.",
    )
    line_max_wait: Seconds = Field(
        default=LINE_MAX_WAIT_S, description="Longest a request may wait in the GPU line (seconds); it is then told so."
    )
    concurrent_starts: Count = Field(
        default=None,
        description="Notebook servers that start at once on this machine; the others wait their turn, told their "
        "place (a class pressing Start together). Empty: 2 per CPU core; 0: all at once.",
    )
    admin_password_from: str = Field(
        default="",
        description='The admins\' first password: "file:PATH" (mode 0600) or "env:NAME"; empty: generated, shown once.',
    )
    smallest_slice: Amount = Field(
        default=quantity_text(DEFAULT_SMALLEST_SLICE),
        description="The smallest GPU slice a server may ask for; smaller ones are refused (CUDA needs about this).",
    )
    monitoring: Monitoring = Field(
        default_factory=Monitoring,
        description="enabled, webhook_url, scrape_interval, the monitoring ports and oncall (an OnCall).",
    )
    market: Market = Field(
        default_factory=Market,
        description="url, models_root, images_catalog, models_catalog, proposals_per_hour (docs/markets.md).",
    )
    notice_mail: NoticeMail | None = Field(
        default=None, description="Mail the weekly idle notice (gpuslice usage --send); none: files only."
    )
    limits: dict[str, Any] = Field(
        default_factory=dict,
        description="As root, each server's cgroup: memory, processes, cpu_weight, tmp, shm, home, and under "
        "classes each class's own (spawner/cgroups.py has the defaults; docs/security.md#limits-per-server).",
    )

    @field_validator("limits", mode="before")
    @classmethod
    def _limits(cls, raw: Any) -> Any:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("must be a mapping (for example limits: {memory: 4GiB})")
        try:
            parse_settings_limits(raw)
        except LimitsError as exc:
            raise ValueError(str(exc).removeprefix("limits: ").removeprefix("limits.")) from None
        return raw

    @model_validator(mode="after")
    def _limits_of_known_classes(self) -> Settings:
        named = set(self.limits.get("classes") or {}) - {g.name for g in self.groups}
        if named:
            known = ", ".join(sorted(g.name for g in self.groups)) or "none configured"
            raise ValueError(f"limits.classes names no class of groups: {', '.join(sorted(named))} (classes: {known})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _gpus_simulate(cls, data: Any) -> Any:
        """The file's ``gpus: {simulate: SPEC}`` is the field ``simulate``."""
        if isinstance(data, dict) and "gpus" in data:
            gpus = data["gpus"] or {}
            if not isinstance(gpus, dict):
                raise ValueError("gpus must be a mapping (for example gpus: {simulate: 2x16GiB:T4})")
            data = {k: v for k, v in data.items() if k != "gpus"}
            if "simulate" in gpus:
                data["simulate"] = str(gpus["simulate"])
        return data

    @field_validator("simulate")
    @classmethod
    def _gpu_spec(cls, spec: str) -> str:
        try:
            parse_gpu_spec(spec)
        except ValueError as exc:
            raise ValueError(f"gpus.simulate: {exc}") from None
        return spec

    @field_validator("data_dir", mode="before")
    @classmethod
    def _folder(cls, value: Any) -> Any:
        if not isinstance(value, str | Path) or not str(value):
            raise ValueError("must be a folder path")
        return value

    @field_validator("images", mode="before")
    @classmethod
    def _images(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise ValueError("must map image ids to {path, description}")
        return {str(name): spec for name, spec in raw.items()}

    @field_validator("user_env", mode="before")
    @classmethod
    def _absolute(cls, value: Any) -> Any:
        if not Path(str(value)).is_absolute():
            raise ValueError("must be an absolute folder path (such as /opt/gpuslice/user)")
        return value

    @field_validator("admin_password_from", mode="before")
    @classmethod
    def _password_source(cls, value: Any) -> Any:
        if not isinstance(value, str) or (value and not value.startswith(("file:", "env:"))):
            raise ValueError(f'must be "file:PATH" or "env:NAME", not {value!r}')
        return value

    @field_validator("monitoring", "market", "notice_mail", mode="before")
    @classmethod
    def _a_mapping(cls, value: Any, info: Any) -> Any:
        if value is None and info.field_name != "notice_mail":
            return {}
        if value is not None and not isinstance(value, dict | BaseModel):
            raise ValueError(f"must be a mapping ({', '.join(_SECTION_KEYS[info.field_name])})")
        return value


_SECTION_KEYS = {
    "monitoring": ("enabled", "webhook_url", "ports", "oncall"),
    "market": tuple(sorted(Market.keys())),
    "notice_mail": ("smtp_smarthost", "smtp_from", "address"),
}


# The keys a settings file may have: the fields, with the GPU spec under gpus.simulate.
TOP_LEVEL_KEYS = Settings.keys()

DEFAULT_CONFIG = Path("gpuslice.yaml")  # read by `gpuslice up` and written by `gpuslice class add` without --config


def default_isolation() -> str:
    """As root, an account per user: otherwise every notebook would run as root (docs/security.md)."""
    return "unix-users" if os.geteuid() == 0 else "none"


INSTALLED_CONFIG = Path("/etc/gpuslice/gpuslice.yaml")  # the installed platform's (`gpuslice install`)


def config_path(given: Path | None, installed: Path = INSTALLED_CONFIG) -> Path | None:
    """The settings file to use: the one given, else ./gpuslice.yaml where it exists, else the installed
    platform's, else none (defaults)."""
    if given is not None:
        return given
    return next((path for path in (DEFAULT_CONFIG, installed) if path.exists()), None)


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
    """The settings in ``raw`` (a settings file's mapping), checked; SettingsError names ``source`` and the key."""
    internal = sorted(str(k) for k in raw if k in Settings.not_keys)  # fields the reader sets, not keys
    if internal:
        raise SettingsError(f"{source}: {unknown_keys_message(internal, Settings.keys())}")
    try:
        return Settings.model_validate({**raw, "source": source})
    except ValidationError as exc:
        raise SettingsError(f"{source}: {problems(exc)}") from None


def from_environment(env: environ.Environment | None = None) -> Settings:
    """The settings a process of `gpuslice up` runs with: the file its environment names, with the data
    folder and the markets' places `gpuslice up` handed down (spawner/environ.py) put in."""
    env = env or environ.read()
    path = env.get(environ.SETTINGS)
    settings = load(Path(path) if path else None)
    market = settings.market.model_copy(
        update={
            "url": env.get(environ.MARKET_URL) or settings.market.url,
            "models_root": env.get(environ.MODELS_ROOT) or settings.market.models_root,
        }
    )
    data_dir = Path(env.get(environ.DATA_DIR) or settings.data_dir)
    return settings.model_copy(update={"data_dir": data_dir, "market": market})


def market_url(settings: Settings) -> str:
    return settings.market.url or f"sqlite:///{(settings.data_dir / 'market.sqlite').absolute()}"


def models_root(settings: Settings) -> Path:
    return Path(settings.market.models_root or settings.data_dir / "models").absolute()
