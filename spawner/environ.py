"""Every environment variable gpuslice reads, declared once with what it means, and read here only.

In the pure core so that every layer may import it. Code names these variables through
the declarations here, never by a literal name, and reads the process environment only
through ``read()``: one typed snapshot (``Environment``), the one place where an unset
variable gets its default (tests/test_environ.py checks both). What a variable *means* for
the settings (the data folder, the markets' database) is applied by the settings model
(hub/settings.py ``from_environment``). Exceptions: the kernel hook (spawner/kernel_hook/),
which runs in users' kernels without our packages (the test checks that its names match
the ones here), and the hand-over of secrets (spawner/secretenv.py), which moves them
between the environment and a 0600 file. docs/platform.md#environment-variables lists the
``GPUSLICE_*`` variables for people.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnvVar:
    name: str
    doc: str  # what it means, who sets it, who reads it
    default: str = ""


# -- the single-machine platform: set by `gpuslice up` for the hub and its services ------------
SETTINGS = EnvVar("GPUSLICE_SETTINGS", "Path of the settings YAML the hub and the portal read (empty: defaults).")
DATA_DIR = EnvVar("GPUSLICE_DATA_DIR", "The data folder (hub database, ledger, homes); overrides settings data_dir.")
MARKET_URL = EnvVar("GPUSLICE_MARKET_URL", "SQLAlchemy URL of the market database (empty: from settings).")
MODELS_ROOT = EnvVar("GPUSLICE_MODELS_ROOT", "Folder holding the model market's files (empty: from settings).")
PROMETHEUS_URL = EnvVar(
    "GPUSLICE_PROMETHEUS_URL", "Prometheus as the portal reaches it (empty: 127.0.0.1 and the port in settings)."
)
ALERTMANAGER_URL = EnvVar(
    "GPUSLICE_ALERTMANAGER_URL", "Alertmanager as the portal reaches it (empty: 127.0.0.1 and the port in settings)."
)
PROMETHEUS_TOKEN_FILE = EnvVar(
    "GPUSLICE_PROMETHEUS_TOKEN_FILE", "File holding the API token Prometheus scrapes /hub/metrics with."
)
MONITORING_PASSWORD_FILE = EnvVar(
    "GPUSLICE_MONITORING_PASSWORD_FILE",
    "File (0600) holding the basic-auth password of Prometheus and Alertmanager (user gpuslice); empty: no auth.",
)
STREAMLIT_PORT = EnvVar(
    "GPUSLICE_STREAMLIT_PORT", "Port of the Streamlit server behind the portal gate (0: any free port).", "0"
)
PORTAL_SECRET = EnvVar(
    "GPUSLICE_PORTAL_SECRET", "Hex key the gate signs the identity header with; set by the gate for its Streamlit only."
)
SECRETS_FILE = EnvVar(
    "GPUSLICE_SECRETS_FILE",
    "A 0600 file of a service's secrets (hub tokens, the portal key), read and deleted as it starts.",
)
DEVICE_DIR = EnvVar(
    "GPUSLICE_DEVICE_DIR",
    "Where the GPUs' device nodes are, for each server's device rules (default /dev; a test's folder of mknod nodes).",
    "/dev",
)
NODE_NAME = EnvVar("GPUSLICE_NODE_NAME", "The exporter's Hostname label (default: localhost).")
SERVICE = EnvVar(
    "GPUSLICE_SERVICE",
    '"systemd" when the hub runs as the installed service (gpuslice install): servers outlive its stops and '
    "restarts (a full stop is gpuslice stop --all); set by gpuslice up --service.",
)

# -- Kubernetes: set by the chart's Deployments ---------------------------------------------------
KUBE_VALUES = EnvVar(
    "GPUSLICE_KUBE_VALUES",
    "The chart's rendered values file (a ConfigMap) the hub and the portal read (hub/kube_values.py).",
    "/etc/gpuslice/values.yaml",
)
HUB_URL = EnvVar("GPUSLICE_HUB_URL", "The hub's Service URL, as notebook pods reach it.")
DB_URL = EnvVar("GPUSLICE_DB_URL", "JupyterHub's database URL (empty: SQLite on the hub's volume).")
METRICS_TOKEN = EnvVar("GPUSLICE_METRICS_TOKEN", "API token of the prometheus service (read:metrics).")
PORTAL_TOKEN = EnvVar("GPUSLICE_PORTAL_TOKEN", "API token of the portal service.")
ADMIN_PASSWORD_FILE = EnvVar(
    "GPUSLICE_ADMIN_PASSWORD_FILE",
    "File holding the admins' password (the chart mounts it from a Secret); the hub sets it at every start.",
)
BACKEND = EnvVar("GPUSLICE_BACKEND", '"kubernetes" when the portal runs in the chart (else: the local ledger).')

# -- notebook servers: set by the spawners, read in the server and by the kernel hook --------------
GPU_MEMORY_BYTES = EnvVar("GPUSLICE_GPU_MEMORY_BYTES", "The slice in bytes; the kernel hook caps frameworks to it.")
GPU_MEMORY_FRACTION = EnvVar("GPUSLICE_GPU_MEMORY_FRACTION", "The slice as a fraction of the card, for the hook.")
ISOLATION = EnvVar("GPUSLICE_ISOLATION", "How the slice is enforced: none, software (HAMi) or hardware (MIG, whole).")
SIMULATED = EnvVar("GPUSLICE_SIMULATED", '"1" when the server\'s GPUs are simulated (no NVIDIA GPU on the machine).')
MODELS = EnvVar("GPUSLICE_MODELS", "Comma-separated ids of the models mounted in the server.")
MODELS_DIR = EnvVar("GPUSLICE_MODELS_DIR", "The folder in the server where the models are mounted.")

# -- batch jobs: set by the job runner for the job's processes (spawner/jobs.py job_env, docs/jobs.md) --------
JOB_ID = EnvVar("GPUSLICE_JOB_ID", "The job's id (a job's processes only; the exporter names the job by it).")
JOB_USER = EnvVar("GPUSLICE_JOB_USER", "The job's owner (a job's processes only; the exporter's per-process series).")
JOB_ATTEMPT = EnvVar(
    "GPUSLICE_JOB_ATTEMPT", "Which attempt of the job this is: 1, then 2 after a retry or a preemption."
)
JOB_PRIORITY = EnvVar("GPUSLICE_JOB_PRIORITY", "The job's priority class: normal or backfill.")
JOB_GRACE_S = EnvVar(
    "GPUSLICE_JOB_GRACE_S", "Seconds from the SIGTERM that stops a job to the SIGKILL: time to write a checkpoint."
)
JOB_TIME_LIMIT_S = EnvVar("GPUSLICE_JOB_TIME_LIMIT_S", "The job's time limit in seconds.")
JOB_PREEMPTIBLE = EnvVar(
    "GPUSLICE_JOB_PREEMPTIBLE",
    '"1" for a backfill job: a SIGTERM may come when a person needs its slice; checkpoint, and it runs again later.',
)
JOB_PREEMPTED = EnvVar(
    "GPUSLICE_JOB_PREEMPTED", "How many times this backfill job was stopped for a person before: above 0, resume."
)

# -- set by others: JupyterHub for its managed services, Kubernetes in every pod ---------------------
HUB_API_URL = EnvVar(
    "JUPYTERHUB_API_URL", "The hub's REST API, for a service JupyterHub started.", "http://127.0.0.1:8081/hub/api"
)
HUB_API_TOKEN = EnvVar("JUPYTERHUB_API_TOKEN", "A JupyterHub service's own API token (moved to a 0600 file first).")
SERVICE_PREFIX = EnvVar(
    "JUPYTERHUB_SERVICE_PREFIX", "The URL prefix of a service behind the proxy.", "/services/portal/"
)
SERVICE_URL = EnvVar("JUPYTERHUB_SERVICE_URL", "Where a JupyterHub service listens.", "http://127.0.0.1:8502")
POD_NAMESPACE = EnvVar("POD_NAMESPACE", "The pod's namespace (the chart sets it from the downward API).", "default")
KUBE_API_HOST = EnvVar("KUBERNETES_SERVICE_HOST", "The Kubernetes API's address in every pod (set by Kubernetes).")
KUBE_API_PORT = EnvVar("KUBERNETES_SERVICE_PORT", "The Kubernetes API's port in every pod (set by Kubernetes).", "443")

ALL: tuple[EnvVar, ...] = tuple(v for v in globals().values() if isinstance(v, EnvVar))


@dataclass(frozen=True)
class Environment:
    """The variables above as one typed snapshot of a process's environment (``read()``)."""

    values: Mapping[str, str] = field(repr=False)  # the raw variables: tokens among them, never printed

    def get(self, var: EnvVar) -> str:
        """The value, or the variable's default when unset or empty."""
        return self.values.get(var.name) or var.default

    def require(self, var: EnvVar) -> str:
        """The value; a clear error naming the variable when it is unset (the chart sets it)."""
        value = self.values.get(var.name)
        if not value:
            raise RuntimeError(f"{var.name} is not set: {var.doc}")
        return value

    @property
    def on_kubernetes(self) -> bool:
        """The portal runs in the chart (GPUSLICE_BACKEND=kubernetes), not beside the local ledger."""
        return self.get(BACKEND) == "kubernetes"

    @property
    def streamlit_port(self) -> int:
        return int(self.get(STREAMLIT_PORT) or 0)

    @property
    def pod_namespace(self) -> str:
        return self.get(POD_NAMESPACE)

    @property
    def in_cluster_api(self) -> dict[str, str]:
        """The Kubernetes API's address variables, as a managed service's environment needs them."""
        return {v.name: self.values[v.name] for v in (KUBE_API_HOST, KUBE_API_PORT) if self.values.get(v.name)}

    def kube_api_url(self) -> str | None:
        """The in-cluster API server's URL (None: not in a pod)."""
        host = self.values.get(KUBE_API_HOST.name)
        return f"https://{host}:{self.get(KUBE_API_PORT)}" if host else None


def named(name: str) -> str:
    """A variable the settings name by hand (``admin_password_from: env:NAME``); empty when unset."""
    return os.environ.get(name, "")


def read(environ: Mapping[str, str] | None = None) -> Environment:
    """The declared variables of ``environ`` (default: this process's), the one read of the environment."""
    source = os.environ if environ is None else environ
    return Environment({v.name: source[v.name] for v in ALL if v.name in source})
