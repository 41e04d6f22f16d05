"""JupyterHub configuration for the single-machine platform (loaded by `gpuslice up`).

Reads the settings through the settings model (hub/settings.py ``from_environment``: the file
and the data folder `gpuslice up` names in the environment); what every gpuslice hub shares
(the rules, logins, the culler, the GPU line and its reclaimer, the portal) is wired by
hub/wiring.py ``configure_hub``. Here: what only the single machine has.
"""
# ruff: noqa: F821  (`c` is provided by JupyterHub when it loads this file)

import json
import os
import sys
from pathlib import Path

from hub import homes, metrics, renewals, userenv
from hub.accounts import known_names, service_token
from hub.classes import CLI_SERVICE
from hub.settings import from_environment
from hub.top_cli import TOP_SERVICE
from hub.wiring import Accounts, HubParts, LiveClasses, configure_hub, incident_recorder, renewals_service
from spawner import environ, start_turns
from spawner.assets import HOOK_DIR
from spawner.card_health import CardLedger
from spawner.cgroups import limits_for
from spawner.gpus import machine
from spawner.ledger import Ledger

env = environ.read()
settings = from_environment(env)
data_dir = settings.data_dir.absolute()
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
# In the foreground, stopping the platform stops every notebook server. As the installed service
# they outlive the hub, each in its scope, for the next start to adopt (gpuslice stop --all ends them).
service = env.get(environ.SERVICE)
c.JupyterHub.cleanup_servers = not service

# Notebook servers with GPU slices, as local processes.
c.JupyterHub.spawner_class = "spawner.local.LocalGpuSpawner"
c.LocalGpuSpawner.gpu_simulate = settings.simulate
c.LocalGpuSpawner.isolation = settings.isolation
# As root, each server in a cgroup of its own with these limits (spawner/confinement.py).
c.LocalGpuSpawner.gpu_limits = dict(settings.limits)
c.LocalGpuSpawner.gpu_device_dir = env.get(environ.DEVICE_DIR)
if settings.isolation == "unix-users":
    # Servers run as each user's own account, from an environment every account can read
    # (gpuslice up builds it: hub/userenv.py), with the hook copied there too.
    c.LocalGpuSpawner.user_env_prefix = str(settings.user_env)
    c.LocalGpuSpawner.gpu_kernel_hook_dir = str(userenv.hook_dir(settings.user_env))
    c.LocalGpuSpawner.gpu_lab_dir = str(userenv.lab_dir(settings.user_env))
c.LocalGpuSpawner.gpu_smallest_slice = settings.smallest_slice
c.LocalGpuSpawner.home_root = str(data_dir / "homes")
c.LocalGpuSpawner.default_url = "/lab"
# A class pressing Start together on a small machine: 50 jupyterlab servers on 2 cores take
# about 80 s to answer (gpuslice bench class); wait rather than fail them.
c.LocalGpuSpawner.http_timeout = 180
c.LocalGpuSpawner.start_timeout = 300  # a spawn waiting in the GPU line gets gpu_line_max_wait on top
c.LocalGpuSpawner.gpu_line_max_wait = settings.line_max_wait
# ... and start a few at a time, the others told their turn: all at once, none answered (spawner/start_turns.py).
c.LocalGpuSpawner.gpu_concurrent_starts = (
    settings.concurrent_starts if settings.concurrent_starts is not None else start_turns.default_limit()
)
# The same for kernels: under that load a new kernel can take over a minute to answer, and
# jupyter_server presumes it dead after 60 s (measured: 2-4 of 50 cells lost).
c.LocalGpuSpawner.args = ["--MappingKernelManager.kernel_info_timeout=180"]
# The markets (gpuslice up migrates and seeds the database before the hub starts).
c.LocalGpuSpawner.gpu_market_url = env.get(environ.MARKET_URL)
c.LocalGpuSpawner.gpu_models_root = env.get(environ.MODELS_ROOT)
if settings.images:
    c.LocalGpuSpawner.gpu_images = {
        "default": {
            "path": str(settings.user_env) if settings.isolation == "unix-users" else sys.prefix,
            "description": "The platform's own Python environment",
        },
        **{name: image.model_dump() for name, image in settings.images.items()},
    }

# Managed services end with the hub even when it is killed (hub/with_hub.py says why).
with_hub = (sys.executable, "-m", "hub.with_hub", f"--hub-pid={os.getpid()}")  # this config runs in the hub
# Prometheus scrapes /hub/metrics with a token that can read metrics and nothing else.
token_file = env.get(environ.PROMETHEUS_TOKEN_FILE)
metrics_token = Path(token_file).read_text().strip() if token_file and Path(token_file).exists() else ""
configure_hub(
    c,
    settings,
    HubParts(
        spawner="LocalGpuSpawner",
        ledger_path=str(ledger_path),
        run_module=with_hub,
        accounts=Accounts(data_dir, frozenset(known_names(settings))),
        # `gpuslice top` run as root on this machine reads the hub with this read-only token (0600 file).
        top_token=service_token(data_dir, TOP_SERVICE),
        # Classes change in the running hub (the portal's Teaching page, `gpuslice class` with its token).
        classes=LiveClasses(data_dir / "classes.sqlite", data_dir, service_token(data_dir, CLI_SERVICE)),
        # The portal: an auth gate (HubOAuth) in front of Streamlit, started by the hub.
        portal={
            "display": True,
            "url": f"http://127.0.0.1:{settings.portal_port}",
            "command": [*with_hub, "portal.gate"],
            # Its token from a 0600 file in the data folder (the hub hands it over; hub.with_hub keeps
            # it out of the gate's /proc/PID/environ), so the platform's account can check its scopes.
            "api_token": service_token(data_dir, "portal"),
            "environment": {
                environ.SETTINGS.name: env.get(environ.SETTINGS),
                environ.DATA_DIR.name: str(data_dir),
                environ.MARKET_URL.name: env.get(environ.MARKET_URL),
                environ.MODELS_ROOT.name: env.get(environ.MODELS_ROOT),
                environ.PROMETHEUS_URL.name: f"http://127.0.0.1:{settings.monitoring.prometheus_port}",
                environ.ALERTMANAGER_URL.name: f"http://127.0.0.1:{settings.monitoring.alertmanager_port}",
                environ.STREAMLIT_PORT.name: str(settings.streamlit_port),  # 0: any free port
                environ.MONITORING_PASSWORD_FILE.name: env.get(environ.MONITORING_PASSWORD_FILE),
            },
        },
        metrics_token=metrics_token,
        # Batch jobs (hub/job_dispatch.py): placed from the GPU line, run as their owners, confined as servers are.
        jobs_args=(
            f"--data-dir={data_dir}",
            f"--simulate={settings.simulate}",
            f"--hook-dir={userenv.hook_dir(settings.user_env) if settings.isolation == 'unix-users' else HOOK_DIR}",
            f"--device-dir={env.get(environ.DEVICE_DIR)}",
            f"--limits={json.dumps(dict(settings.limits))}",
        ),
        managed=tuple(
            filter(
                None,
                (
                    # Every alert Alertmanager sends, recorded as it arrives (portal/recorder.py), whether or
                    # not anyone has the portal open; gpuslice up made its webhook token and told Alertmanager.
                    incident_recorder(settings, data_dir, with_hub, env.get(environ.MONITORING_PASSWORD_FILE)),
                    # What has a horizon renews itself (hub/renewals.py): the Alertmanager config (the
                    # rotation's 26 weeks) daily, the idle-holder notices weekly when notice_mail.weekly is on.
                    renewals_service(env.get(environ.SETTINGS), data_dir, with_hub, service=bool(service)),
                    # Each free card checked every 6 hours; one that fails is out of placement (hub/patrol.py).
                    {
                        "name": "gpu-patrol",
                        "command": [
                            *with_hub,
                            "hub.patrol",
                            f"--ledger={ledger_path}",
                            f"--simulate={settings.simulate}",
                            f"--faults={data_dir / 'monitoring' / 'faults.json'}",
                        ],
                    },
                ),
            )
        ),
    ),
)
# Each renewal's last success, served at /hub/metrics for the RenewalOverdue alert.
renewals.register(renewals.state_path(data_dir))

# Capacity and allocations, read from the ledger at each scrape of /hub/metrics.
_machine = machine(settings.simulate)
metrics.register_allocations(
    metrics.AllocationCollector("localhost", lambda: _machine.gpus, lambda: Ledger(ledger_path).holdings())
)
# Home folders' sizes against limits.home (no filesystem quotas here: hub/homes.py), for HomeOverSize.
_home_sizes = homes.HomeSizes(lambda: homes.homes(settings.isolation, data_dir / "homes"))
_home_sizes.start()
_classes_of = {m: [g.name for g in settings.groups if m in g.members] for g in settings.groups for m in g.members}


def _home_limit(user: str) -> int:
    return limits_for(settings.limits, _classes_of.get(user, [])).home_bytes


metrics.register_allocations(metrics.HomeCollector(_home_sizes.latest, _home_limit))
# Each card's last patrol (gpuslice patrol, the gpu-patrol service), for GpuPatrolFailed.
metrics.register_allocations(metrics.PatrolCollector("localhost", lambda: CardLedger(ledger_path).health()))
# ... and told to the user on the hub's home page and in JupyterLab (hub/notice.py).
c.JupyterHub.template_vars.update({homes.HOME_NOTICE: homes.home_notice(_home_sizes, _home_limit)})  # lazy until set
