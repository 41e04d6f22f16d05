"""The chart's rendered values (helm/gpuslice/templates/hub/configmap.yaml) and Zero to JupyterHub's
``custom.gpuslice``: the settings model (hub/settings.py ``Platform``) in the charts' camelCase.

On Kubernetes the hub (hub/kube_config.py), the idle culler it starts and the portal
(portal/data/deployment.py) all read the same ConfigMap, mounted at ``environ.KUBE_VALUES``,
through ``load_kube_values``: a key the chart renders and the model lacks (or the
other way round) is an error naming the key, never a silent default. Secrets (database
URLs, tokens, the admins' password) are not in the ConfigMap: the chart hands them to
the containers from Secrets, and the methods here combine the two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from hub.settings import Contact, Market, NoticeMail, OnCall, Platform, read_oncall
from spawner import environ, sharing
from spawner.cgroups import DEFAULT_LIMITS
from spawner.checked import PositiveInt, UrlOrEmpty, one_of, problems
from spawner.placement import POLICIES

DATA_DIR = "/srv/gpuslice/data"  # the hub's PersistentVolumeClaim, mounted by the chart
KUBE_BACKENDS = tuple(sharing.names(kubernetes=True))  # the cluster's ways to share GPUs (spawner/sharing/)


# monitoring.oncall.existingSecret is mounted here (0440) in the pod that runs `gpuslice oncall-config`.
ONCALL_SECRET_DIR = Path("/etc/gpuslice-oncall")


def secret_files(oncall: Any) -> Any:
    """The chart's monitoring.oncall as gpuslice.yaml has it: each ``*_url_key`` (a key of the on-call
    Secret) becomes a ``*_url_file`` under ONCALL_SECRET_DIR; the Secret's name is the chart's business."""
    if not isinstance(oncall, dict):
        return oncall  # read_oncall says what it must be

    def files(entry: Any, key: str) -> Any:
        if not isinstance(entry, dict) or key not in entry:
            return entry
        entry = dict(entry)
        entry[key.removesuffix("_key") + "_file"] = str(ONCALL_SECRET_DIR / str(entry.pop(key)))
        return entry

    out = files({k: v for k, v in oncall.items() if k != "existingSecret"}, "deadman_url_key")
    out = files(out, "smtp_auth_password_key")
    if isinstance(out.get("rotation"), list):
        out["rotation"] = [files(c, "webhook_url_key") for c in out["rotation"]]
    for tier in ("second_line", "owner"):
        if tier in out:
            out[tier] = files(out[tier], "webhook_url_key")
    return out


def secrets_read_from(oncall: OnCall, folder: Path) -> OnCall:
    """``oncall`` with its Secret's files taken from ``folder`` instead of the pod's mount
    (`gpuslice oncall-config --secret-dir`: the Secret's keys saved as files elsewhere)."""

    def moved(path: Path | None) -> Path | None:
        return folder / path.relative_to(ONCALL_SECRET_DIR) if path and path.is_relative_to(ONCALL_SECRET_DIR) else path

    def contact(person: Contact | None) -> Contact | None:
        return person and person.model_copy(update={"webhook_url_file": moved(person.webhook_url_file)})

    return oncall.model_copy(
        update={
            "rotation": tuple(contact(c) for c in oncall.rotation),
            "second_line": contact(oncall.second_line),
            "owner": contact(oncall.owner),
            "deadman_url_file": moved(oncall.deadman_url_file),
            "smtp_auth_password_file": moved(oncall.smtp_auth_password_file),
        }
    )


# noticeMail.existingSecret is mounted here (0440) in the CronJob that mails the weekly notice.
NOTICE_SECRET_DIR = Path("/etc/gpuslice-notice-mail")
NOTICE_CHART_ONLY = ("existingSecret", "schedule")  # the chart's business: the Secret's name, the CronJob's schedule


def notice_secret_files(notice_mail: Any) -> Any:
    """The chart's noticeMail as gpuslice.yaml has notice_mail: ``password_key`` and ``ca_key`` (keys of the
    Secret existingSecret) become ``password_file`` and ``ca_file`` under NOTICE_SECRET_DIR; {} is none."""
    if not isinstance(notice_mail, dict):
        return notice_mail  # NoticeMail says what it must be
    out = {k: v for k, v in notice_mail.items() if k not in NOTICE_CHART_ONLY}
    for key in ("password_key", "ca_key"):
        if key in out:
            out[key.removesuffix("_key") + "_file"] = str(NOTICE_SECRET_DIR / str(out.pop(key)))
    return out or None


class KubeValuesError(ValueError):
    """A values file that cannot be used; the message names the file and the key."""


class KubeValues(Platform):
    """What the chart renders for gpuslice's containers (camelCase, as in values.yaml).

    The fields every deployment shares (admins, groups, the timeouts, sign-up) and their
    defaults and rules are ``Platform``'s: written once, for gpuslice.yaml and the chart alike.
    """

    # The file's keys are the chart's camelCase (gpushareMemoryUnit); the fields are snake_case.
    model_config = ConfigDict(alias_generator=to_camel)

    backend: one_of(*KUBE_BACKENDS) = Field(  # type: ignore[valid-type]
        default="gpushare", description="How the cluster shares GPUs (docs/kubernetes.md)."
    )
    backend_settings: dict[str, Any] = Field(
        default_factory=dict, description="gpuSharing.<backend>: the backend's own settings (dra, kai)."
    )
    policy: one_of(*POLICIES) = Field(  # type: ignore[valid-type]
        default="default", description="The placement policy the hub checks a request with (docs/placement.md)."
    )
    gpushare_memory_unit: one_of("", "GiB", "MiB") = Field(  # type: ignore[valid-type]
        default="",
        description="gpushare's device plugin --memory-unit: the unit of aliyun.com/gpu-mem (empty: inferred "
        "from the nodes, as gpushare's inspect tool does).",
    )
    singleuser: dict[str, Any] = Field(default_factory=dict, description="hub.singleuser: KubeSpawner's pod settings.")
    notebook_image: str = Field(description="The notebook image (images.notebook).")
    proxy_api_url: str = Field(description="The proxy's REST API, as the hub reaches it.")
    portal_url: str = Field(default="", description="The portal's Service URL, as the proxy reaches it.")
    portal_enabled: bool = Field(default=False, description="portal.enabled.")
    models_claim: str = Field(default="", description="markets.models.existingClaim: the model files' volume.")
    scheduler_name: str = Field(default="", description="The gpuslice scheduler (schedulerExtender.enabled), or ''.")
    data_dir: Path = Field(default=Path(DATA_DIR), description="The hub's volume: SQLite, the passwords.")
    prometheus_url: UrlOrEmpty = Field(
        default="", description="The Prometheus the portal queries, as its pod reaches it ('': none)."
    )
    alertmanager_url: UrlOrEmpty = Field(
        default="", description="The Alertmanager of the portal's Alerts page, as its pod reaches it ('': none)."
    )
    cpu_jobs: int = Field(
        default=DEFAULT_LIMITS.cpu_jobs,
        ge=1,
        le=1000,
        description="CPU-only batch jobs one person may have starting, running or stopping at once (one machine's"
        " limits.cpu_jobs): they wait for no GPU slice, so this bounds a loop of submissions.",
    )
    proposals_per_hour: PositiveInt = Field(
        default=Market.model_fields["proposals_per_hour"].default,
        description="Model proposals one user may make per hour in the portal.",
    )
    oncall: OnCall = Field(default_factory=OnCall, description="monitoring.oncall: the on-call rotation and tiers.")
    notice_mail: NoticeMail | None = Field(
        default=None,
        description="The weekly idle-holder notice: gpuslice.yaml's notice_mail (docs/operations.md); the relay "
        "password and CA are keys of the Secret existingSecret (password_key, ca_key), never values. With "
        "weekly: true a CronJob mails last week's notices (hub/renewals.py).",
    )

    @field_validator("notice_mail", mode="before")
    @classmethod
    def _notice_mail_files(cls, raw: Any) -> Any:
        return notice_secret_files(raw)

    @field_validator("oncall", mode="before")
    @classmethod
    def _oncall_checked(cls, raw: Any) -> OnCall:
        """The checks of gpuslice.yaml's monitoring.oncall (contacts reachable, email needs smtp_*)."""
        return raw if isinstance(raw, OnCall) else read_oncall(secret_files(raw or {}), "the chart's values")

    def sharing_backend(self) -> sharing.SharingBackend:
        """The GPU sharing backend with its settings as the hub's spawner has them (hub/kube_config.py):
        ``gpuSharing.<backend>``, and gpushare's memory unit."""
        settings = sharing.settings_from_values(self.backend, self.backend_settings)
        if self.backend == "gpushare":
            settings["memory_unit"] = self.gpushare_memory_unit
        return sharing.backend(self.backend, **settings)

    def db_url(self, env: environ.Environment) -> str:
        """JupyterHub's database: the Secret's URL (hub.db.existingSecret), else SQLite on the volume."""
        return env.get(environ.DB_URL) or f"sqlite:///{self.data_dir / 'jupyterhub.sqlite'}"

    def market_url(self, env: environ.Environment) -> str:
        """The markets' database: the Secret's URL (markets.existingSecret), else SQLite on the hub's volume."""
        return env.get(environ.MARKET_URL) or f"sqlite:///{self.data_dir / 'market.sqlite'}"


class Z2jhValues(Platform):
    """Zero to JupyterHub's hub: ``custom.gpuslice`` (camelCase), with z2jh's own ``cull.timeout`` as the
    idle timeout and ``KubeGpuSpawner.gpu_groups`` as the groups (helm/z2jh-values.yaml)."""

    # The idle timeout is z2jh's culler's: its errors name that key.
    model_config = ConfigDict(alias_generator=lambda name: "cull.timeout" if name == "idle_timeout" else to_camel(name))
    # z2jh has its own keys for these (cull.timeout, its authenticator's): not custom.gpuslice's.
    not_keys = ("admin_users", "groups", "idle_timeout", "open_signup", "trusted_proxies")


def load_kube_values(path: Path | None = None) -> KubeValues:
    """The values file at ``path`` (default: environ.KUBE_VALUES); KubeValuesError on anything malformed."""
    path = path or Path(environ.read().get(environ.KUBE_VALUES))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise KubeValuesError(
            f"{path}: cannot read the chart's values ({exc.strerror}); is the ConfigMap mounted?"
        ) from None
    except yaml.YAMLError as exc:
        raise KubeValuesError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise KubeValuesError(f"{path}: the top level must be a mapping of keys to values")
    try:
        return KubeValues.model_validate(raw)
    except ValidationError as exc:
        raise KubeValuesError(f"{path}: {problems(exc)} (render the chart and the images from one release)") from None
