"""JupyterHub configuration for the single-machine platform (loaded by `gpuslice up`).

Reads the gpuslice settings file and the data folder named in the environment
(spawner/environ.py: SETTINGS, empty for the defaults, and DATA_DIR); everything else follows from them.
"""
# ruff: noqa: F821  (`c` is provided by JupyterHub when it loads this file)

import os
import sys
from pathlib import Path

from hub import metrics, roles, userenv
from hub.accounts import known_names, passwords_path, service_token
from hub.classes_api import add_live_classes, seed_classes
from hub.line_api import LINE_HANDLERS, show_the_line_soon
from hub.settings import load
from spawner import environ
from spawner.gpus import machine
from spawner.ledger import Ledger
from spawner.waitline import warning_lead

settings = load(Path(environ.SETTINGS.get()) if environ.SETTINGS.get() else None)
data_dir = Path(environ.DATA_DIR.get() or settings.data_dir).absolute()
repo = Path(__file__).resolve().parents[1]
ledger_path = data_dir / "ledger.sqlite"

c = get_config()  # type: ignore[name-defined]

c.JupyterHub.bind_url = f"http://127.0.0.1:{settings.port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings.hub_port
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
c.JupyterHub.db_url = f"sqlite:///{data_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(data_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(data_dir / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(data_dir / "proxy.pid")
c.ConfigurableHTTPProxy.command = [str(repo / "node_modules" / ".bin" / "configurable-http-proxy")]
c.JupyterHub.cleanup_servers = True  # stopping the platform stops every notebook server

# Logins (hub/accounts.py): admins log in with the password gpuslice gave them, class members
# join once at /hub/join with their invite code; with open_signup a new name, and only a new
# one, sets its password.
c.JupyterHub.authenticator_class = "hub.accounts.GpusliceAuthenticator"
c.GpusliceAuthenticator.dbm_path = str(passwords_path(data_dir))
c.GpusliceAuthenticator.create_users = settings.open_signup
c.GpusliceAuthenticator.data_dir = str(data_dir)  # invite codes (/hub/join)
c.Authenticator.admin_users = set(settings.admin_users)
# Classes live in a store the hub, its spawners and `gpuslice class` share: they change without a
# restart (hub/classes_api.py); its members at start are known names too. A member added later
# becomes a hub user with an invite code at once, so they may join and log in.
c.JupyterHub.load_groups = {g["name"]: {"users": list(g["members"])} for g in settings.groups}
classes_path = data_dir / "classes.sqlite"
live = seed_classes(classes_path, settings.groups)
members = {m for rules in live for m in [*(rules.get("members") or ()), *(rules.get("teachers") or ())]}
c.GpusliceAuthenticator.known_names = known_names(settings) | members
if settings.open_signup:
    c.Authenticator.allow_all = True
else:
    c.Authenticator.allowed_users = members | set(settings.admin_users)

# Notebook servers with GPU slices.
# Our pages first (the spawn-pending page's words for the GPU line); JupyterHub's for the rest.
c.JupyterHub.template_paths.prepend([str(Path(__file__).parent / "templates")])
# The GPU line's warnings for JupyterLab's notification (spawner/lab) and the home page (a hub
# page, not a service: it is read with the hub's login cookie, from the same origin as JupyterLab),
# and the line's API, from which the portal's Queue takes each waiting spawn's estimated start.
c.JupyterHub.extra_handlers = list(LINE_HANDLERS)
show_the_line_soon(c)  # Start that waits in line shows its place within 2 s
c.JupyterHub.spawner_class = "spawner.local.LocalGpuSpawner"
c.LocalGpuSpawner.gpu_simulate = settings.simulate
c.LocalGpuSpawner.gpu_ledger_path = str(ledger_path)
c.LocalGpuSpawner.gpu_groups = [dict(g) for g in settings.groups]
c.LocalGpuSpawner.isolation = settings.isolation
if settings.isolation == "unix-users":
    # Servers run as each user's own account, from an environment every account can read
    # (gpuslice up builds it: hub/userenv.py), with the hook copied there too.
    c.LocalGpuSpawner.user_env_prefix = str(settings.user_env)
    c.LocalGpuSpawner.gpu_kernel_hook_dir = str(userenv.hook_dir(settings.user_env))
    c.LocalGpuSpawner.gpu_lab_dir = str(userenv.lab_dir(settings.user_env))
c.LocalGpuSpawner.gpu_smallest_slice = settings.smallest_slice
# Activity is what each server reports (running code, saving, terminals: spawner/lab/
# jupyter_server_config.py), not the proxy's traffic: an open JupyterLab page polls its server
# every few seconds, so a server left open on a screen would never look idle to the reclaimer
# or the culler.
c.JupyterHub.last_activity_interval = 0
c.LocalGpuSpawner.home_root = str(data_dir / "homes")
c.LocalGpuSpawner.gpu_culler_timeout = settings.idle_timeout  # the culler's: its stops are named
c.LocalGpuSpawner.default_url = "/lab"
# A class pressing Start together on a small machine: 50 jupyterlab servers on 2 cores take
# about 80 s to answer (gpuslice bench class); wait rather than fail them.
c.LocalGpuSpawner.http_timeout = 180
c.LocalGpuSpawner.start_timeout = 300  # a spawn waiting in the GPU line gets gpu_line_max_wait on top
c.LocalGpuSpawner.gpu_idle_timeout = settings.gpu_idle_timeout  # estimates: someone waits, so reclaiming applies
c.LocalGpuSpawner.gpu_line_max_wait = settings.line_max_wait
# The same for kernels: under that load a new kernel can take over a minute to answer, and
# jupyter_server presumes it dead after 60 s (measured: 2-4 of 50 cells lost).
c.LocalGpuSpawner.args = ["--MappingKernelManager.kernel_info_timeout=180"]
# The markets (gpuslice up migrates and seeds the database before the hub starts).
c.LocalGpuSpawner.gpu_market_url = environ.MARKET_URL.get()
c.LocalGpuSpawner.gpu_models_root = environ.MODELS_ROOT.get()
if settings.images:
    c.LocalGpuSpawner.gpu_images = {
        "default": {
            "path": str(settings.user_env) if settings.isolation == "unix-users" else sys.prefix,
            "description": "The platform's own Python environment",
        },
        **settings.images,
    }

# Managed services end with the hub even when it is killed (hub/with_hub.py says why).
with_hub = [sys.executable, "-m", "hub.with_hub", f"--hub-pid={os.getpid()}"]  # this config runs in the hub
# Idle servers give their slice back.
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [*with_hub, "jupyterhub_idle_culler", f"--timeout={settings.idle_timeout}"],
    }
]
c.JupyterHub.load_roles = [roles.service_role("idle-culler", roles.STOPS_IDLE_SERVERS)]
# While anyone waits for a GPU, idle slices go to the line (hub/reclaimer.py), after a warning.
reclaim_after = settings.gpu_idle_timeout
c.JupyterHub.services.append(
    {
        "name": "gpu-reclaimer",
        "command": [
            *with_hub,
            "hub.reclaimer",
            f"--ledger={ledger_path}",
            f"--gpu-idle-timeout={reclaim_after}",
            f"--warn-before={warning_lead(reclaim_after)}",
            f"--interval={min(30.0, reclaim_after / 10)}",
        ],
    }
)
c.JupyterHub.load_roles.append(roles.service_role("gpu-reclaimer", roles.STOPS_IDLE_SERVERS))
# The portal: an auth gate (HubOAuth) in front of Streamlit, started by the hub.
c.JupyterHub.services.append(
    {
        "name": "portal",
        "display": True,
        "url": f"http://127.0.0.1:{settings.portal_port}",
        "command": [*with_hub, "portal.gate"],
        # Its token from a 0600 file in the data folder (the hub hands it over; hub.with_hub keeps
        # it out of the gate's /proc/PID/environ), so the platform's account can check its scopes.
        "api_token": service_token(data_dir, "portal"),
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": roles.PORTAL_OAUTH_SCOPES,
        "environment": {
            environ.SETTINGS.name: environ.SETTINGS.get(),
            environ.DATA_DIR.name: str(data_dir),
            environ.MARKET_URL.name: environ.MARKET_URL.get(),
            environ.MODELS_ROOT.name: environ.MODELS_ROOT.get(),
            environ.PROMETHEUS_URL.name: f"http://127.0.0.1:{settings.monitoring['prometheus_port']}",
            environ.ALERTMANAGER_URL.name: f"http://127.0.0.1:{settings.monitoring['alertmanager_port']}",
            environ.STREAMLIT_PORT.name: str(settings.streamlit_port),  # 0: any free port
            environ.MONITORING_PASSWORD_FILE.name: environ.MONITORING_PASSWORD_FILE.get(),
        },
    }
)
c.JupyterHub.load_roles += [roles.USER_ROLE, roles.service_role("portal", roles.PORTAL_READS)]

# Prometheus scrapes /hub/metrics with a token that can read metrics and nothing else.
token_file = environ.PROMETHEUS_TOKEN_FILE.get()
if token_file and Path(token_file).exists():
    c.JupyterHub.services.append({"name": "prometheus", "api_token": Path(token_file).read_text().strip()})
    c.JupyterHub.load_roles.append(roles.service_role("prometheus", roles.READS_METRICS))

# Capacity and allocations, read from the ledger at each scrape of /hub/metrics.
_machine = machine(settings.simulate)
metrics.register_allocations(
    metrics.AllocationCollector("localhost", lambda: _machine.gpus, lambda: Ledger(ledger_path).holdings())
)

# Last: its handler, service and role are added to the lists set above (hub/classes_api.py).
add_live_classes(c, "LocalGpuSpawner", classes_path, data_dir)
