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
from pathlib import Path
from typing import Any

from hub import roles
from hub.classes_api import add_live_classes, seed_classes
from hub.line_api import LINE_HANDLERS, show_the_line_soon
from spawner.waitline import warning_lead

TEMPLATES = Path(roles.__file__).parent / "templates"  # found from the package: kube_config.py is copied out of it
# A managed service gets only the environment it is given: the API's address for its in-cluster
# client (the ServiceAccount's token is a file in the pod, not an environment variable).
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def reclaimer_service(ledger_path: str, namespace: str, idle_timeout_s: int) -> dict[str, Any]:
    """The gpu-reclaimer as a JupyterHub managed service, looking every tenth of the idle timeout (30 s at most)."""
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
        ],
        "environment": {k: os.environ[k] for k in IN_CLUSTER_ENV if k in os.environ},
    }


def add_gpu_line(
    c: Any, ledger_path: str, namespace: str, idle_timeout_s: int = 900, classes: list[dict[str, Any]] | None = None
) -> None:
    """Configure the line's file, pages and reclaimer on JupyterHub's config ``c`` (adds to what is there),
    and the classes that change live beside it (hub/classes_api.py; ``classes``: the configured ones,
    default the spawner's gpu_groups).

    ``idle_timeout_s`` is the reclaimer's and the spawner's (the line's estimated start times use it).
    """
    volume = Path(ledger_path).parent
    declared = classes if classes is not None else list(c.KubeGpuSpawner.get("gpu_groups", None) or [])
    seed_classes(volume / "gpuslice-classes.sqlite", declared)
    add_live_classes(c, "KubeGpuSpawner", volume / "gpuslice-classes.sqlite", volume)
    c.KubeGpuSpawner.gpu_ledger_path = ledger_path
    c.KubeGpuSpawner.gpu_idle_timeout = idle_timeout_s
    # Activity is what each server reports, not the proxy's traffic: an open JupyterLab page polls
    # its server every few seconds (spawner/lab/jupyter_server_config.py, in the notebook images).
    c.JupyterHub.last_activity_interval = 0
    c.JupyterHub.template_paths = [str(TEMPLATES), *_listed(c.JupyterHub, "template_paths")]
    c.JupyterHub.extra_handlers = [*_listed(c.JupyterHub, "extra_handlers"), *LINE_HANDLERS]
    show_the_line_soon(c)
    c.JupyterHub.services = [
        *_listed(c.JupyterHub, "services"),
        reclaimer_service(ledger_path, namespace, idle_timeout_s),
    ]
    c.JupyterHub.load_roles = [
        *_listed(c.JupyterHub, "load_roles"),
        roles.service_role("gpu-reclaimer", roles.STOPS_IDLE_SERVERS),
    ]


def _listed(section: Any, name: str) -> list[Any]:
    """A list setting as configured so far (none yet: empty)."""
    value = section.get(name) if hasattr(section, "get") else None
    return list(value) if isinstance(value, list | tuple) else []
