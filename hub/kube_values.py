"""The chart's rendered values (helm/gpuslice/templates/hub/configmap.yaml), read by one typed reader.

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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hub.settings import Contact, OnCall, read_oncall, validation_problems
from spawner import environ
from spawner.quotas import GroupRulesError, group_rules

DATA_DIR = "/srv/gpuslice/data"  # the hub's PersistentVolumeClaim, mounted by the chart


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


class KubeValuesError(ValueError):
    """A values file that cannot be used; the message names the file and the key."""


class KubeValues(BaseModel):
    """What the chart renders for gpuslice's containers (camelCase, as in values.yaml)."""

    # The file's keys are the chart's camelCase (gpushareMemoryUnit); the fields are snake_case.
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    backend: str = Field(default="gpushare", description="gpuSharing.backend: how the cluster shares GPUs.")
    policy: str = Field(default="default", description="gpuSharing.policy: the placement policy.")
    gpushare_memory_unit: str = Field(default="GiB", description="gpuSharing.gpushareMemoryUnit (GiB or MiB).")
    admin_users: tuple[str, ...] = Field(default=(), description="Users who may see and stop every server.")
    groups: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Classes: members, GPU rules (maxSlice, budget, ...), profiles."
    )
    idle_timeout: int = Field(
        default=3600, gt=0, description="hub.idleTimeout: seconds before the culler stops a server."
    )
    gpu_idle_timeout: int = Field(
        default=900,
        gt=0,
        description="hub.gpuIdleTimeout: seconds idle before the gpu-reclaimer stops a GPU server while others wait.",
    )
    open_signup: bool = Field(default=True, description="hub.openSignup: anyone may create an account at first login.")
    singleuser: dict[str, Any] = Field(default_factory=dict, description="hub.singleuser: KubeSpawner's pod settings.")
    notebook_image: str = Field(description="The notebook image (images.notebook).")
    proxy_api_url: str = Field(description="The proxy's REST API, as the hub reaches it.")
    portal_url: str = Field(default="", description="The portal's Service URL, as the proxy reaches it.")
    portal_enabled: bool = Field(default=False, description="portal.enabled.")
    models_claim: str = Field(default="", description="markets.models.existingClaim: the model files' volume.")
    scheduler_name: str = Field(default="", description="The gpuslice scheduler (schedulerExtender.enabled), or ''.")
    data_dir: Path = Field(default=Path(DATA_DIR), description="The hub's volume: SQLite, the passwords.")
    prometheus_url: str = Field(default="", description="monitoring.prometheusUrl: the Prometheus the portal queries.")
    alertmanager_url: str = Field(default="", description="monitoring.alertmanagerUrl: the portal's Alerts page.")
    proposals_per_hour: int = Field(default=3, gt=0, description="markets.proposalsPerHour: model proposals per user.")
    oncall: OnCall = Field(default_factory=OnCall, description="monitoring.oncall: the on-call rotation and tiers.")

    @model_validator(mode="after")
    def _reclaiming_before_culling(self) -> KubeValues:
        if self.gpu_idle_timeout >= self.idle_timeout:
            raise ValueError(
                f"hub.gpuIdleTimeout ({self.gpu_idle_timeout} s) must be below hub.idleTimeout"
                f" ({self.idle_timeout} s): the idle culler would stop the server first and nothing would be"
                " reclaimed for the GPU line; lower gpuIdleTimeout or raise idleTimeout"
            )
        return self

    @field_validator("oncall", mode="before")
    @classmethod
    def _oncall_checked(cls, raw: Any) -> OnCall:
        """The checks of gpuslice.yaml's monitoring.oncall (contacts reachable, email needs smtp_*)."""
        return raw if isinstance(raw, OnCall) else read_oncall(secret_files(raw or {}), "the chart's values")

    def db_url(self) -> str:
        """JupyterHub's database: the Secret's URL (hub.db.existingSecret), else SQLite on the volume."""
        return environ.DB_URL.get() or f"sqlite:///{self.data_dir / 'jupyterhub.sqlite'}"

    def market_url(self) -> str:
        """The markets' database: the Secret's URL (markets.existingSecret), else SQLite on the hub's volume."""
        return environ.MARKET_URL.get() or f"sqlite:///{self.data_dir / 'market.sqlite'}"

    def group_rules(self) -> dict[str, dict[str, Any]]:
        """Each class's rules by name, through the one parser of group rules ({"members", "max_slice", ...})."""
        try:
            return {name: group_rules(name, rules) for name, rules in self.groups.items()}
        except GroupRulesError as exc:
            raise KubeValuesError(f"groups: {exc}") from None

    def group_list(self) -> tuple[dict[str, Any], ...]:
        """The classes as the settings model has them: {"name", "members", "max_slice", ...}."""
        return tuple({"name": name, **rules} for name, rules in self.group_rules().items())


def load_kube_values(path: Path | None = None) -> KubeValues:
    """The values file at ``path`` (default: environ.KUBE_VALUES); KubeValuesError on anything malformed."""
    path = path or Path(environ.KUBE_VALUES.get())
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
        values = KubeValues.model_validate(raw)
    except ValidationError as exc:
        raise KubeValuesError(
            f"{path}: {validation_problems(exc)} (render the chart and the images from one release)"
        ) from None
    values.group_list()  # a bad group rule is refused here, for every reader alike
    return values
