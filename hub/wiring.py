"""One wiring of JupyterHub for every gpuslice hub: ``configure_hub(c, platform, parts)``.

Three hubs load it: the single machine (hub/jupyterhub_config.py), the chart's
(hub/kube_config.py) and a Zero to JupyterHub release (helm/z2jh-values.yaml's
``hub.extraConfig`` calls ``configure_z2jh_hub``). Each reads its own settings into the
one model (hub/settings.py ``Platform``) and passes what only it knows in ``HubParts``
(which spawner, how a managed service is run, where the line's file is, the portal's
address and token); everything else is wired here, once:

* the spawner's GPU rules: the groups, the reclaimer's and the culler's timeouts, the line's file;
* logins (hub/accounts.py) and the classes as JupyterHub groups, where gpuslice manages accounts;
* the idle culler, where gpuslice runs it (z2jh runs its own, ``cull.*``);
* the GPU line's hub side: its pages and API (hub/line_api.py, hub/templates), the servers' presence
  reports (hub/presence.py) and the ``gpu-reclaimer`` service that gives idle GPU servers and those
  whose owners left to it after a warning (hub/reclaimer.py);
* classes that change in the running hub, where the hub keeps a class store: the store its
  spawners read at every spawn, seeded with the configured classes at each start, its API
  (hub/classes_api.py) and the ``gpuslice-cli`` service `gpuslice class` changes it with;
* the portal service and its OAuth scopes, and the metrics reader;
* services only one hub runs (``HubParts.managed``): the single machine's incident recorder
  (portal/recorder.py) and renewals (hub/renewals.py), built by ``incident_recorder`` and
  ``renewals_service`` below (on Kubernetes the chart runs them as a container and CronJobs);
* every service's role (hub/roles.py).

A service added to the hub is added here. Lists already in ``c`` (z2jh's own services and
roles) are kept; an entry of the same name is completed, not doubled.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hub import roles
from hub.accounts import passwords_path, roster_names, service_token
from hub.activity import clamp_future_activity
from hub.classes import CLI_SERVICE
from hub.classes_api import CLASSES_HANDLERS
from hub.jobs_api import JOBS_HANDLERS
from hub.line_api import LINE_HANDLERS, SLOW_SPAWN_TIMEOUT_S
from hub.logins import LOOPBACK
from hub.presence import PRESENCE_HANDLERS
from hub.reclaimer import max_hold_options
from hub.settings import CULLER_TIMEOUT_S, Platform, Settings, SettingsError
from spawner import environ
from spawner.checked import problems
from spawner.class_store import ClassStore
from spawner.quotas import DEFAULT_GROUP, GroupRules, classes
from spawner.waitline import warning_lead

TEMPLATES = Path(roles.__file__).parent / "templates"  # from the package: kube_config.py is copied out of it
# JupyterHub's own server role's scopes (jupyterhub/roles.py): what $JUPYTERHUB_API_TOKEN may do by default.
SERVER_TOKEN_SCOPES = ("users:activity!user", "access:servers!server")


@dataclass(frozen=True)
class Accounts:
    """gpuslice's logins (hub/accounts.py): passwords and invite codes in ``data_dir``."""

    data_dir: Path
    known_names: frozenset[str]  # admins and class members: their first password comes from gpuslice


@dataclass(frozen=True)
class LiveClasses:
    """Classes that change in the running hub (hub/classes_api.py), kept in a class store (spawner/class_store.py)."""

    store: Path  # the class store's SQLite file
    data_dir: Path  # where invite codes and passwords are (hub/accounts.py): members added live get codes
    cli_token: str = ""  # the gpuslice-cli service's token (`gpuslice class` on the hub's machine); empty: none


@dataclass(frozen=True)
class HubParts:
    """What one hub knows and the others do not."""

    spawner: str  # the spawner's config section: LocalGpuSpawner or KubeGpuSpawner
    ledger_path: str  # the GPU line's (and locally the slices') SQLite file
    run_module: tuple[str, ...]  # how a managed service runs a Python module: [*run_module, "hub.reclaimer", ...]
    reclaimer_args: tuple[str, ...] = ()  # the reclaimer's backend arguments (--kube-namespace=...)
    service_env: Mapping[str, str] = field(default_factory=dict)  # the reclaimer's environment (in-cluster API)
    accounts: Accounts | None = None  # None: the hub's own authenticator (z2jh's)
    run_culler: bool = True  # False: someone else culls (z2jh's cull.*), with platform.idle_timeout
    portal: Mapping[str, Any] | None = None  # the portal service's own keys (url, token, command); None: no portal
    metrics_token: str = ""  # a token that may read /hub/metrics (Prometheus'); empty: none
    top_token: str = ""  # `gpuslice top`'s read-only token on one machine; empty: none (admins use their own)
    classes: LiveClasses | None = None  # None: the classes are the configured ones, changed by a restart
    managed: tuple[dict[str, Any], ...] = ()  # services only this hub runs (the single machine's recorder, renewals)
    jobs_args: tuple[str, ...] | None = None  # the job dispatcher's backend arguments (None: this hub runs no jobs)


def configure_hub(c: Any, platform: Platform, parts: HubParts) -> None:
    """Wire JupyterHub's config ``c`` for ``platform`` (adds to what is there, never doubles a service)."""
    groups = _live_classes(c, platform, parts.classes) if parts.classes is not None else platform.groups
    _spawner(c, platform, parts)
    if parts.accounts is not None:
        _accounts(c, platform, parts.accounts, groups)
    _hub_groups(c, groups)
    # Activity is what each server reports (running code, saving, terminals: spawner/lab/
    # jupyter_server_config.py), not the proxy's traffic: an open JupyterLab page polls its server
    # every few seconds, so a server left open on a screen would never look idle to the reclaimer
    # or the culler.
    c.JupyterHub.last_activity_interval = 0
    clamp_future_activity()  # and never later than now: a forged report buys no idle-free hour (hub/activity.py)
    # Our pages first (the spawn page's words for the line, the home page's reclaim warning).
    c.JupyterHub.template_paths = [str(TEMPLATES), *(p for p in _listed(c.JupyterHub, "template_paths") if p)]
    handlers = [
        *LINE_HANDLERS,
        *PRESENCE_HANDLERS,
        *(CLASSES_HANDLERS if parts.classes is not None else []),
        *(JOBS_HANDLERS if parts.jobs_args is not None else []),
    ]
    there = _listed(c.JupyterHub, "extra_handlers")
    c.JupyterHub.extra_handlers = [*there, *(h for h in handlers if h not in there)]
    # Start that waits in line shows its place on the spawn page within seconds, not after JupyterHub's
    # slow_spawn_timeout of 10 s (a refusal still comes back to the form within it).
    _tornado_settings(c, slow_spawn_timeout=SLOW_SPAWN_TIMEOUT_S)
    for service, scopes in _services(platform, parts, groups):
        _add_service(c, service, scopes)
    if parts.portal is not None:
        _add_role(c, roles.USER_ROLE)


def _spawner(c: Any, platform: Platform, parts: HubParts) -> None:
    spawner = c[parts.spawner]
    spawner.gpu_groups = list(platform.groups)  # classes' rules and the default rules (spawner/quotas.py)
    if parts.classes is not None:
        spawner.gpu_classes_path = str(parts.classes.store)  # the classes read at every spawn: they change live
    spawner.gpu_ledger_path = parts.ledger_path
    spawner.gpu_idle_timeout = platform.gpu_idle_timeout  # the line's estimated starts count on reclaiming
    spawner.gpu_culler_timeout = platform.idle_timeout  # the culler's: its stops are named
    if parts.jobs_args is not None:
        # A server's own token may submit and follow its user's jobs (`gpuslice job` in a terminal, JupyterLab's
        # "Run as job"): JupyterHub's server role, with the user's own servers (docs/security.md#jobs).
        spawner.server_token_scopes = [*SERVER_TOKEN_SCOPES, "servers!user", "read:users:groups!user"]


def _live_classes(c: Any, platform: Platform, live: LiveClasses) -> tuple[GroupRules, ...]:
    """The class store at the hub's start, the configured classes taken in (spawner/class_store.py ``seed``),
    for its API; the rules that hold now: the store's classes and the configured default rules."""
    store = ClassStore(live.store)
    store.seed(classes(platform.groups))
    _tornado_settings(c, gpuslice_classes_path=str(live.store), gpuslice_data_dir=str(live.data_dir))
    return (*store.groups(), *(g for g in platform.groups if g.name == DEFAULT_GROUP))


def _tornado_settings(c: Any, **settings: Any) -> None:
    there = c.JupyterHub.get("tornado_settings", None) if hasattr(c.JupyterHub, "get") else None
    c.JupyterHub.tornado_settings = {**dict(there or {}), **settings}


def _accounts(c: Any, platform: Platform, accounts: Accounts, groups: tuple[GroupRules, ...]) -> None:
    """Admins log in with the password gpuslice gave them, class members join once at /hub/join with
    their invite code; with open sign-up a new name, and only a new one, sets its password."""
    known = {*accounts.known_names, *roster_names((), classes(groups))}  # a class made live: its people too
    c.JupyterHub.authenticator_class = "hub.authenticator.GpusliceAuthenticator"
    c.GpusliceAuthenticator.dbm_path = str(passwords_path(accounts.data_dir))  # kept across restarts
    c.GpusliceAuthenticator.create_users = platform.open_signup
    c.GpusliceAuthenticator.data_dir = str(accounts.data_dir)  # invite codes (invites.dbm), beside the passwords
    c.GpusliceAuthenticator.known_names = known
    c.GpusliceAuthenticator.trusted_proxies = [*LOOPBACK, *platform.trusted_proxies]  # failed logins per client
    c.Authenticator.admin_users = set(platform.admin_users)
    if platform.open_signup:
        c.Authenticator.allow_all = True
    else:  # and the hub users a class's change made since (JupyterHub allows existing users)
        c.Authenticator.allowed_users = known


def _hub_groups(c: Any, groups: tuple[GroupRules, ...]) -> None:
    """The classes as JupyterHub groups (the portal and the line read their members there), beside the
    groups the config already names (z2jh's)."""
    there = c.JupyterHub.get("load_groups", None) if hasattr(c.JupyterHub, "get") else None
    found = {name: list((group or {}).get("users") or []) for name, group in dict(there or {}).items()}
    for rules in classes(groups):
        users = found.setdefault(rules.name, [])
        users += [m for m in rules.members if m not in users]
    if found:
        c.JupyterHub.load_groups = {name: {"users": users} for name, users in found.items()}


def _services(
    platform: Platform, parts: HubParts, groups: tuple[GroupRules, ...]
) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """Each managed service with the scopes of its role."""
    run = list(parts.run_module)
    found: list[tuple[dict[str, Any], tuple[str, ...]]] = []
    if parts.run_culler:
        culler = {
            "name": "idle-culler",
            "command": [*run, "jupyterhub_idle_culler", f"--timeout={platform.idle_timeout}"],
        }
        found.append((culler, roles.STOPS_IDLE_SERVERS))
    found.append((reclaimer_service(platform, parts, groups), roles.STOPS_IDLE_SERVERS))
    if parts.jobs_args is not None:
        found.append((job_dispatcher_service(platform, parts), ()))  # it needs nothing of the hub's API
    if parts.portal is not None:
        portal = {
            "name": "portal",
            **parts.portal,
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": roles.PORTAL_OAUTH_SCOPES,
        }
        found.append((portal, roles.PORTAL_READS))
    if parts.metrics_token:
        found.append(({"name": "prometheus", "api_token": parts.metrics_token}, roles.READS_METRICS))
    if parts.top_token:
        found.append(({"name": "gpuslice-top", "api_token": parts.top_token}, roles.TOP_READS))
    if parts.classes is not None and parts.classes.cli_token:
        found.append(({"name": CLI_SERVICE, "api_token": parts.classes.cli_token}, roles.CHANGES_CLASSES))
    found += [(dict(service), ()) for service in parts.managed]  # they need nothing of the hub's API
    return found


def incident_recorder(
    settings: Settings, data_dir: Path, run_module: tuple[str, ...], password_file: str
) -> dict[str, Any] | None:
    """The single machine's incident recorder (portal/recorder.py), when gpuslice up made its webhook
    token (monitoring on, Alertmanager installed); on Kubernetes it is a container of the portal's pod."""
    from hub.monitoring import recorder_token_path

    token = recorder_token_path(data_dir / "monitoring")
    monitoring = settings.monitoring
    if not monitoring.enabled or not token.exists():
        return None
    return {
        "name": "incident-recorder",
        "command": [
            *run_module,
            "portal.recorder",
            f"--data-dir={data_dir}",
            f"--port={monitoring.recorder_port}",
            f"--token-file={token}",
            f"--alertmanager-url=http://127.0.0.1:{monitoring.alertmanager_port}",
            f"--prometheus-url=http://127.0.0.1:{monitoring.prometheus_port}",
            *([f"--password-file={password_file}"] if password_file else []),
        ],
    }


def renewals_service(
    settings_file: str, data_dir: Path, run_module: tuple[str, ...], service: bool = False
) -> dict[str, Any]:
    """The single machine's renewals (hub/renewals.py); on Kubernetes the chart's CronJobs do them.
    As the installed service, Alertmanager is a unit of its own, which its reload writes again for."""
    from hub.service_units import ALERTMANAGER

    return {
        "name": "renewals",
        "command": [
            *run_module,
            "hub.renewals",
            *([f"--config={settings_file}"] if settings_file else []),
            f"--data-dir={data_dir}",
            *([f"--alertmanager-unit={ALERTMANAGER}"] if service else []),
        ],
    }


def reclaimer_service(
    platform: Platform, parts: HubParts, groups: tuple[GroupRules, ...] | None = None
) -> dict[str, Any]:
    """The gpu-reclaimer as a JupyterHub managed service, looking every tenth of the idle timeout (30 s at most),
    with each class's max_hold (a bound however used a slice looks; ``groups``: the rules at the hub's start,
    default the configured ones)."""
    idle_timeout_s = platform.gpu_idle_timeout
    return {
        "name": "gpu-reclaimer",
        "command": [
            *parts.run_module,
            "hub.reclaimer",
            f"--ledger={parts.ledger_path}",
            *parts.reclaimer_args,
            f"--gpu-idle-timeout={idle_timeout_s}",
            f"--gpu-left-timeout={platform.gpu_left_timeout}",
            f"--gpu-no-input-timeout={platform.gpu_no_input_timeout}",
            f"--gpu-release-timeout={platform.gpu_release_timeout}",
            f"--warn-before={warning_lead(idle_timeout_s)}",
            f"--interval={min(30.0, min(idle_timeout_s, platform.gpu_left_timeout) / 10)}",
            *max_hold_options(platform.groups if groups is None else groups),
        ],
        **({"environment": dict(parts.service_env)} if parts.service_env else {}),
    }


def job_dispatcher_service(platform: Platform, parts: HubParts) -> dict[str, Any]:
    """The job dispatcher (hub/job_dispatch.py) as a managed service: jobs from the GPU line to their runners,
    with the groups' rules as configured (and the class store, where classes change live)."""
    groups = json.dumps([g.model_dump(mode="json") for g in platform.groups])
    return {
        "name": "job-dispatcher",
        "command": [
            *parts.run_module,
            "hub.job_dispatch",
            f"--ledger={parts.ledger_path}",
            f"--groups={groups}",
            *([f"--classes={parts.classes.store}"] if parts.classes is not None else []),
            *(parts.jobs_args or ()),
        ],
        **({"environment": dict(parts.service_env)} if parts.service_env else {}),
    }


def _add_service(c: Any, service: dict[str, Any], scopes: tuple[str, ...]) -> None:
    """Add ``service`` and its role; one of the same name already there (z2jh's portal) is completed."""
    services = _listed(c.JupyterHub, "services")
    there = next((s for s in services if isinstance(s, dict) and s.get("name") == service["name"]), None)
    if there is None:
        services.append(service)
    else:
        there.update({k: v for k, v in service.items() if k not in there})
    c.JupyterHub.services = services
    _add_role(c, roles.service_role(service["name"], scopes))


def _add_role(c: Any, role: dict[str, Any]) -> None:
    found = _listed(c.JupyterHub, "load_roles")
    if not any(isinstance(r, dict) and r.get("name") == role["name"] for r in found):
        found.append(role)
    c.JupyterHub.load_roles = found


def _listed(section: Any, name: str) -> list[Any]:
    """A list setting as configured so far (none yet: empty)."""
    value = section.get(name) if hasattr(section, "get") else None
    return list(value) if isinstance(value, list | tuple) else []


# -- Zero to JupyterHub ------------------------------------------------------------------------


def configure_z2jh_hub(c: Any, get_config: Callable[..., Any]) -> None:
    """A Zero to JupyterHub hub (helm/z2jh-values.yaml's extraConfig): z2jh keeps its authenticator,
    its culler (``cull.*``) and its services' tokens; gpuslice adds the rest, as on the chart's hub.

    ``get_config`` is z2jh's own (``z2jh.get_config``): ``custom.gpuslice`` holds gpuslice's keys
    (camelCase); the groups are ``KubeGpuSpawner.gpu_groups`` and the culler's timeout ``cull.timeout``.
    """
    from hub.kube_values import Z2jhValues

    culling = bool(get_config("cull.enabled", False))
    custom = dict(get_config("custom.gpuslice", {}) or {})
    if culling:  # the rule "reclaim before the culler stops it" against z2jh's own culler
        custom["idle_timeout"] = get_config("cull.timeout", CULLER_TIMEOUT_S)
    groups = c.KubeGpuSpawner.get("gpu_groups") if hasattr(c.KubeGpuSpawner, "get") else None
    try:
        platform = Z2jhValues.model_validate({**custom, "groups": list(groups or [])})
    except ValidationError as exc:
        raise SettingsError(f"custom.gpuslice, cull.timeout and KubeGpuSpawner.gpu_groups: {problems(exc)}") from None
    env = environ.read()
    ledger_path = str(c.KubeGpuSpawner.get("gpu_ledger_path") or "/srv/jupyterhub/gpuslice-ledger.sqlite")
    volume = Path(ledger_path).parent  # the hub's volume: the class store and invite codes beside the line
    configure_hub(
        c,
        platform,
        HubParts(
            spawner="KubeGpuSpawner",
            ledger_path=ledger_path,
            run_module=(sys.executable, "-m"),
            reclaimer_args=(f"--kube-namespace={env.pod_namespace}",),
            service_env=env.in_cluster_api,
            run_culler=False,
            portal={} if "portal" in (get_config("hub.services", {}) or {}) else None,
            classes=LiveClasses(volume / "gpuslice-classes.sqlite", volume, service_token(volume, CLI_SERVICE)),
        ),
    )
    if not culling:
        c.KubeGpuSpawner.gpu_culler_timeout = 0  # no culler: no stop is named after it
