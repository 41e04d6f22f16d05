"""JupyterHub configuration in Kubernetes (the Helm chart's hub; images/hub copies it in).

Reads the chart's values (a ConfigMap) through the settings model (hub/kube_values.py
``KubeValues``, the reader the portal shares) and its secrets (from the hub Secret, through
spawner/environ.py); what every gpuslice hub shares (the rules, logins, the culler, the GPU
line and its reclaimer, the portal) is wired by hub/wiring.py ``configure_hub``. Here: what
only the chart's hub has, KubeGpuSpawner's pods.
"""
# ruff: noqa: F821  (`c` is provided by JupyterHub when it loads this file)

import json
import sys
from pathlib import Path

from hub.accounts import passwords_path, read_admin_password, roster_names, service_token, set_admin_passwords
from hub.classes import CLI_SERVICE
from hub.kube_values import load_kube_values
from hub.wiring import Accounts, HubParts, LiveClasses, configure_hub
from market.store import Store
from spawner import environ, sharing

env = environ.read()
values = load_kube_values(Path(env.get(environ.KUBE_VALUES)))
data = values.data_dir  # the hub's PVC
c = get_config()  # type: ignore[name-defined]

c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_url = env.require(environ.HUB_URL)  # the hub's Service, as notebooks reach it
c.JupyterHub.db_url = values.db_url(env)
c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.should_start = False  # the proxy is its own Deployment
c.ConfigurableHTTPProxy.api_url = values.proxy_api_url
c.JupyterHub.cleanup_servers = False  # a hub restart must not stop anyone's notebook

# Admins log in with the Secret's password, set before the hub serves anyone; the chart's class
# members join once at /hub/join with an invite code an admin makes in the hub's pod
# (`kubectl exec ... -- gpuslice user invite`).
if values.admin_users:
    admin_password = read_admin_password(Path(env.require(environ.ADMIN_PASSWORD_FILE)))
    set_admin_passwords(passwords_path(data), values.admin_users, admin_password)

c.JupyterHub.spawner_class = "spawner.kube.KubeGpuSpawner"
c.KubeGpuSpawner.namespace = env.pod_namespace
c.KubeGpuSpawner.gpu_backend = values.backend
c.KubeGpuSpawner.gpushare_memory_unit = values.gpushare_memory_unit
c.KubeGpuSpawner.gpu_backend_settings = sharing.settings_from_values(values.backend, values.backend_settings)
c.KubeGpuSpawner.gpu_policy = values.policy
c.KubeGpuSpawner.gpu_profile_groups = {
    profile: [rules.name for rules in values.groups if profile in rules.profiles]
    for profile in {p for rules in values.groups for p in rules.profiles}
}
c.KubeGpuSpawner.image = values.notebook_image
c.KubeGpuSpawner.gpu_images = {"default": {"container": values.notebook_image, "description": "CUDA notebook base"}}
c.KubeGpuSpawner.gpu_market_url = values.market_url(env)
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

# The job dispatcher reads the cluster with the same sharing backend as the spawner (gpushare's unit included).
_job_backend_settings = {
    **({"memory_unit": values.gpushare_memory_unit} if values.backend == "gpushare" else {}),
    **c.KubeGpuSpawner.gpu_backend_settings,
}
# The GPU line (spawns that wait for room, "wait": true) in the ledger's SQLite file on the hub's
# PVC, kept across restarts (the pods stay the allocations).
configure_hub(
    c,
    values,
    HubParts(
        spawner="KubeGpuSpawner",
        ledger_path=str(data / "ledger.sqlite"),
        run_module=(sys.executable, "-m"),
        reclaimer_args=(f"--kube-namespace={env.pod_namespace}",),
        service_env=env.in_cluster_api,  # a managed service gets only the environment it is given
        accounts=Accounts(data, frozenset(roster_names(values.admin_users, values.groups))),
        portal=(
            {"url": values.portal_url, "api_token": env.require(environ.PORTAL_TOKEN)}
            if values.portal_enabled
            else None
        ),
        metrics_token=env.require(environ.METRICS_TOKEN),
        # Classes change in the running hub (the portal's Teaching page; `gpuslice class` in the hub's pod).
        classes=LiveClasses(data / "gpuslice-classes.sqlite", data, service_token(data, CLI_SERVICE)),
        # Batch jobs as batch/v1 Jobs, made when the GPU line places them (hub/job_dispatch_kube.py).
        jobs_args=(
            f"--kube-namespace={env.pod_namespace}",
            f"--kube-backend={values.backend}",
            f"--kube-backend-settings={json.dumps(_job_backend_settings)}",
            f"--policy={values.policy}",
            f"--limits={json.dumps({'cpu_jobs': values.cpu_jobs})}",
            *([f"--scheduler-name={values.scheduler_name}"] if values.scheduler_name else []),
            *([f"--models-claim={values.models_claim}"] if values.models_claim else []),
        ),
    ),
)
