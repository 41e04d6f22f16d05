"""The GPU line's hub side on Kubernetes, for the chart's hub and for a Zero to JupyterHub hub.

KubeGpuSpawner keeps the line in a SQLite file on the hub's volume (spawner/line.py). Around
it the hub needs three things, the same in both installs:

* the spawn page's words for the line (its place, "Leave the line") and the home page's
  reclaim warning: hub/templates, before JupyterHub's own;
* ``/hub/gpuslice/notice``: a user's warnings as JSON, for that page and JupyterLab's notice
  (hub/notice.py; the notebook image carries the JupyterLab extension);
* ``/hub/api/gpuslice/line``: the line for the portal's Queue view and wait times, read and
  managed with the reader's own token (hub/line_api.py);
* the ``gpu-reclaimer`` service: while anyone waits, an idle GPU server is warned, then
  stopped, and its slice goes to the line (hub/reclaimer.py, reading the notebook pods).

helm/gpuslice's hub calls ``add_gpu_line`` from hub/kube_config.py; with Zero to JupyterHub,
helm/z2jh-values.yaml calls it from ``hub.extraConfig``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hub import roles
from hub.activity import clamp_future_activity
from hub.line_api import LINE_HANDLERS
from hub.reclaimer import max_hold_options
from spawner.waitline import warning_lead

TEMPLATES = Path(roles.__file__).parent / "templates"  # found from the package: kube_config.py is copied out of it
# A managed service gets only the environment it is given: the API's address for its in-cluster
# client (the ServiceAccount's token is a file in the pod, not an environment variable).
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def reclaimer_service(
    ledger_path: str, namespace: str, idle_timeout_s: int, groups: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The gpu-reclaimer as a JupyterHub managed service, looking every tenth of the idle timeout (30 s at most);
    ``groups``: the spawner's group rules, whose ``max_hold`` it applies."""
    return {
        "name": "gpu-reclaimer",
        "command": [
            sys.executable,
            "-m",
            "hub.reclaimer",
            f"--ledger={ledger_path}",
            f"--kube-namespace={namespace}",
            f"--gpu-idle-timeout={idle_timeout_s}",
            f"--warn-before={warning_lead(idle_timeout_s)}",
            f"--interval={min(30.0, idle_timeout_s / 10)}",
            *max_hold_options(groups),
        ],
        "environment": {k: os.environ[k] for k in IN_CLUSTER_ENV if k in os.environ},
    }


def add_gpu_line(c: Any, ledger_path: str, namespace: str, idle_timeout_s: int = 900) -> None:
    """Configure the line's file, pages and reclaimer on JupyterHub's config ``c`` (adds to what is there).

    ``idle_timeout_s`` is the reclaimer's and the spawner's (the line's estimated start times use it).
    """
    c.KubeGpuSpawner.gpu_ledger_path = ledger_path
    c.KubeGpuSpawner.gpu_idle_timeout = idle_timeout_s
    # Activity is what each server reports, not the proxy's traffic: an open JupyterLab page polls
    # its server every few seconds (spawner/lab/jupyter_server_config.py, in the notebook images).
    c.JupyterHub.last_activity_interval = 0
    clamp_future_activity()  # and never later than now (hub/activity.py)
    c.JupyterHub.template_paths = [str(TEMPLATES), *_listed(c.JupyterHub, "template_paths")]
    c.JupyterHub.extra_handlers = [*_listed(c.JupyterHub, "extra_handlers"), *LINE_HANDLERS]
    c.JupyterHub.services = [
        *_listed(c.JupyterHub, "services"),
        reclaimer_service(ledger_path, namespace, idle_timeout_s, _listed(c.KubeGpuSpawner, "gpu_groups")),
    ]
    c.JupyterHub.load_roles = [
        *_listed(c.JupyterHub, "load_roles"),
        roles.service_role("gpu-reclaimer", roles.STOPS_IDLE_SERVERS),
    ]


def _listed(section: Any, name: str) -> list[Any]:
    """A list setting as configured so far (none yet: empty)."""
    value = section.get(name) if hasattr(section, "get") else None
    return list(value) if isinstance(value, list | tuple) else []
