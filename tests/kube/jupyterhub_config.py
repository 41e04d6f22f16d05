"""JupyterHub with KubeGpuSpawner against the Kubernetes API test double (tests/kube/apiserver.py).

Environment: GPUSLICE_TEST_DIR (a scratch folder), GPUSLICE_TEST_PORT, GPUSLICE_TEST_HUB_PORT,
GPUSLICE_TEST_PROXY_PORT, GPUSLICE_TEST_TOKEN (an admin service token), KUBECONFIG.
"""
# ruff: noqa: F821  (`c` is provided by JupyterHub)

import os
import sys
from pathlib import Path

from hub.line_api import LINE_HANDLERS

root = Path(os.environ["GPUSLICE_TEST_DIR"])
repo = Path(__file__).resolve().parents[2]
c = get_config()  # type: ignore[name-defined]

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ['GPUSLICE_TEST_PORT']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ["GPUSLICE_TEST_HUB_PORT"])
c.JupyterHub.hub_connect_ip = "127.0.0.1"  # the fake kubelet's pods live on 127.A.B.N
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['GPUSLICE_TEST_PROXY_PORT']}"
c.ConfigurableHTTPProxy.command = [str(repo / "node_modules" / ".bin" / "configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{root / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(root / "cookie_secret")
c.JupyterHub.pid_file = str(root / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(root / "proxy.pid")
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"line-admin"}  # an admin user, for the GPU line API's tests
c.JupyterHub.allow_named_servers = True  # a student with a server who waits for a second one
c.JupyterHub.load_groups = {"ml101": {"users": ["gina"]}}
c.JupyterHub.services = [{"name": "test-admin", "api_token": os.environ["GPUSLICE_TEST_TOKEN"]}]
c.JupyterHub.load_roles = [
    {
        "name": "test-admin",
        "scopes": ["admin:users", "admin:servers", "access:servers", "read:metrics", "tokens"],
        "services": ["test-admin"],
    }
]

c.JupyterHub.spawner_class = "spawner.kube.KubeGpuSpawner"
c.KubeGpuSpawner.namespace = "gpuslice"
c.KubeGpuSpawner.gpu_backend = os.environ.get("GPUSLICE_TEST_BACKEND", "gpushare")  # dra, kai: test_dra_kai.py
c.KubeGpuSpawner.gpu_inventory_ttl = 1.0
c.KubeGpuSpawner.gpu_groups = [
    {"name": "ml101", "max_slice": "4GiB", "teachers": ["tina"]},
    # Users in no class here are the line's and the spawner's subjects, not the default rules':
    # no limits for them (an explicit choice; the built-in default rules are finite).
    {"name": "default", "max_slice": None, "max_gpus": None, "budget": None, "servers_per_user": None},
]
c.KubeGpuSpawner.gpu_images = {"default": {"container": "ghcr.io/gpuslice/notebook-base:1.0", "description": "base"}}
c.KubeGpuSpawner.image = "ghcr.io/gpuslice/notebook-base:1.0"
c.KubeGpuSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeGpuSpawner.start_timeout = 60
c.KubeGpuSpawner.http_timeout = 60
c.KubeGpuSpawner.poll_interval = 2  # notice an evicted pod quickly (the fault tests)
c.KubeGpuSpawner.k8s_api_request_retry_timeout = 20
c.KubeGpuSpawner.environment = {"GPUSLICE_DOUBLE_ROOT": str(root / "pods")}
c.KubeGpuSpawner.gpu_ledger_path = str(root / "ledger.sqlite")  # the GPU line (the chart's: on the hub's PVC)
c.KubeGpuSpawner.gpu_line_poll = 0.5
c.JupyterHub.template_paths = [str(repo / "hub" / "templates")]  # the spawn page's words for the GPU line
c.JupyterHub.extra_handlers = LINE_HANDLERS  # the line's page and API, as hub/kube_config.py
if os.environ.get("GPUSLICE_TEST_KEEP_SERVERS"):  # a hub restart leaves the servers running, as the chart's does
    c.JupyterHub.cleanup_servers = False
reclaim_after = os.environ.get("GPUSLICE_TEST_RECLAIM_AFTER")
if reclaim_after:  # the GPU line's reclaimer, as hub/kube_config.py runs it, with a short idle timeout
    c.JupyterHub.services.append(
        {
            "name": "gpu-reclaimer",
            "command": [
                sys.executable,
                "-m",
                "hub.reclaimer",
                f"--ledger={root / 'ledger.sqlite'}",
                "--kube-namespace=gpuslice",
                f"--gpu-idle-timeout={reclaim_after}",
                f"--warn-before={float(reclaim_after) / 3}",
                "--interval=1",
            ],
            "environment": {"KUBECONFIG": os.environ["KUBECONFIG"], "PYTHONPATH": str(repo)},
        }
    )
    from hub import roles

    c.JupyterHub.load_roles.append(roles.service_role("gpu-reclaimer", roles.STOPS_IDLE_SERVERS))
if os.environ.get("GPUSLICE_TEST_JOBS"):  # batch jobs as batch/v1 Jobs, as hub/kube_config.py wires them
    import json

    from hub.jobs_api import JOBS_HANDLERS

    c.JupyterHub.extra_handlers = [*c.JupyterHub.extra_handlers, *JOBS_HANDLERS]
    c.JupyterHub.services.append(
        {
            "name": "job-dispatcher",
            "command": [
                sys.executable,
                "-m",
                "hub.job_dispatch",
                f"--ledger={root / 'ledger.sqlite'}",
                f"--groups={json.dumps(c.KubeGpuSpawner.gpu_groups)}",
                "--kube-namespace=gpuslice",
                "--kube-backend=gpushare",
                "--interval=0.5",
            ],
            "environment": {"KUBECONFIG": os.environ["KUBECONFIG"], "PYTHONPATH": str(repo)},
        }
    )
