"""JupyterHub configuration in Kubernetes (the Helm chart's hub; images/hub copies it in).

Reads the chart's values (environ.KUBE_VALUES, a ConfigMap) through hub/kube_values.py,
the reader the portal shares, and its secrets (env vars from the hub Secret). The same
spawner rules as the single-machine platform, with KubeGpuSpawner instead of the ledger.
"""
# ruff: noqa: F821  (`c` is provided by JupyterHub when it loads this file)

import os
import sys
from pathlib import Path

from hub import roles
from hub.accounts import passwords_path, read_admin_password, roster_names, set_admin_passwords
from hub.kube_line import add_gpu_line
from hub.kube_values import load_kube_values
from market.store import Store
from spawner import environ

values = load_kube_values()
data = values.data_dir  # the hub's PVC
c = get_config()  # type: ignore[name-defined]

c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_url = environ.HUB_URL.require()  # the hub's Service, as notebooks reach it
c.JupyterHub.db_url = values.db_url()
c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.should_start = False  # the proxy is its own Deployment
c.ConfigurableHTTPProxy.api_url = values.proxy_api_url
c.JupyterHub.cleanup_servers = False  # a hub restart must not stop anyone's notebook

# Admins and the chart's class members cannot be claimed by whoever types their name first:
# a member joins once at /hub/join with an invite code an admin makes in the hub's pod
# (`kubectl exec ... -- gpuslice user invite`); open sign-up covers only names nobody knows.
c.JupyterHub.authenticator_class = "hub.accounts.GpusliceAuthenticator"
c.GpusliceAuthenticator.dbm_path = str(passwords_path(data))  # on the hub's PVC: kept across restarts
c.GpusliceAuthenticator.create_users = values.open_signup
c.GpusliceAuthenticator.data_dir = str(data)  # invite codes (invites.dbm), beside the passwords
c.GpusliceAuthenticator.known_names = roster_names(values.admin_users, values.group_list())
c.Authenticator.admin_users = set(values.admin_users)
# Admins log in with the Secret's password, set before the hub serves anyone.
if values.admin_users:
    set_admin_passwords(
        passwords_path(data), values.admin_users, read_admin_password(Path(environ.ADMIN_PASSWORD_FILE.require()))
    )
c.Authenticator.allow_all = True
# The chart's camelCase group rules (maxSlice) through the one parser of group rules.
groups = values.group_rules()
c.JupyterHub.load_groups = {name: {"users": list(g.get("members") or [])} for name, g in groups.items()}

c.JupyterHub.spawner_class = "spawner.kube.KubeGpuSpawner"
c.KubeGpuSpawner.namespace = os.environ.get("POD_NAMESPACE", "default")
c.KubeGpuSpawner.gpu_backend = values.backend
c.KubeGpuSpawner.gpushare_memory_unit = values.gpushare_memory_unit
c.KubeGpuSpawner.gpu_policy = values.policy
c.KubeGpuSpawner.gpu_culler_timeout = values.idle_timeout  # the culler's: its stops are named
c.KubeGpuSpawner.gpu_groups = [
    {"name": name, **{k: v for k, v in rules.items() if k not in ("members", "profiles")}}
    for name, rules in groups.items()
]
c.KubeGpuSpawner.gpu_profile_groups = {
    profile: [name for name, rules in groups.items() if profile in (rules.get("profiles") or [])]
    for profile in {p for rules in groups.values() for p in rules.get("profiles") or []}
}
c.KubeGpuSpawner.image = values.notebook_image
c.KubeGpuSpawner.gpu_images = {"default": {"container": values.notebook_image, "description": "CUDA notebook base"}}
c.KubeGpuSpawner.gpu_market_url = values.market_url()
# Every spawn reads the market (KubeGpuSpawner.images): its schema must exist before the first.
# gpuslice up does this on one machine; here the hub does it at start, before it serves anyone.
_market = Store(c.KubeGpuSpawner.gpu_market_url)
_market.migrate()
_market.engine.dispose()
if values.models_claim:
    c.KubeGpuSpawner.gpu_models_volume = {"persistentVolumeClaim": {"claimName": values.models_claim, "readOnly": True}}
singleuser = values.singleuser
c.KubeGpuSpawner.cpu_guarantee = singleuser.get("cpuGuarantee")
c.KubeGpuSpawner.mem_guarantee = singleuser.get("memoryGuarantee")
c.KubeGpuSpawner.mem_limit = singleuser.get("memoryLimit")
c.KubeGpuSpawner.start_timeout = singleuser.get("startTimeout", 300)
if values.scheduler_name:  # the chart's gpuslice-scheduler (schedulerExtender.enabled)
    c.KubeGpuSpawner.scheduler_name = values.scheduler_name
c.KubeGpuSpawner.uid = 1000
c.KubeGpuSpawner.fs_gid = 1000
c.KubeGpuSpawner.allow_privilege_escalation = False
# Notebook pods meet the "restricted" pod security profile (tests/kube checks the manifest).
c.KubeGpuSpawner.pod_security_context = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
c.KubeGpuSpawner.container_security_context = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}

c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={values.idle_timeout}"],
    },
    {"name": "prometheus", "api_token": environ.METRICS_TOKEN.require()},
]
c.JupyterHub.load_roles = [
    roles.service_role("idle-culler", roles.STOPS_IDLE_SERVERS),
    roles.service_role("prometheus", roles.READS_METRICS),
]
# The GPU line (spawns that wait for room, "wait": true) in the ledger's SQLite file on the hub's
# PVC, kept across restarts (the pods stay the allocations); its pages, and the reclaimer that
# gives idle GPU servers to it after a warning (hub/kube_line.py).
add_gpu_line(
    c, str(data / "ledger.sqlite"), c.KubeGpuSpawner.namespace, values.gpu_idle_timeout, list(values.group_list())
)
if values.portal_enabled:
    c.JupyterHub.services.append(
        {
            "name": "portal",
            "url": values.portal_url,
            "api_token": environ.PORTAL_TOKEN.require(),
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": roles.PORTAL_OAUTH_SCOPES,
        }
    )
    c.JupyterHub.load_roles += [roles.USER_ROLE, roles.service_role("portal", roles.PORTAL_READS)]
