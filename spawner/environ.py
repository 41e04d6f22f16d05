"""Every ``GPUSLICE_*`` environment variable, declared once with what it means.

In the pure core so that every layer may import it; code reads and writes these
variables through the declarations here, never by a literal name (tests/test_environ.py
checks it). The one exception is the kernel hook (spawner/kernel_hook/), which runs in
users' kernels without our packages; the test checks that its names match the ones here.
docs/platform.md#environment-variables lists them for people.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    doc: str  # what it means, who sets it, who reads it
    default: str = ""

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The value, or the default when unset or empty."""
        return (os.environ if environ is None else environ).get(self.name) or self.default

    def require(self) -> str:
        """The value; a clear error naming the variable when it is unset (the chart sets it)."""
        value = os.environ.get(self.name)
        if not value:
            raise RuntimeError(f"{self.name} is not set: {self.doc}")
        return value


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
SHARING_BACKEND = EnvVar("GPUSLICE_SHARING_BACKEND", "The chart's GPU sharing backend, for the portal.", "gpushare")
GPUSHARE_MEMORY_UNIT = EnvVar(
    "GPUSLICE_GPUSHARE_MEMORY_UNIT", "gpushare's --memory-unit (GiB or MiB), for the portal's inventory.", "GiB"
)

# -- notebook servers: set by the spawners, read in the server and by the kernel hook --------------
GPU_MEMORY_BYTES = EnvVar("GPUSLICE_GPU_MEMORY_BYTES", "The slice in bytes; the kernel hook caps frameworks to it.")
GPU_MEMORY_FRACTION = EnvVar("GPUSLICE_GPU_MEMORY_FRACTION", "The slice as a fraction of the card, for the hook.")
ISOLATION = EnvVar("GPUSLICE_ISOLATION", "How the slice is enforced: none, software (HAMi) or hardware (MIG, whole).")
SIMULATED = EnvVar("GPUSLICE_SIMULATED", '"1" when the server\'s GPUs are simulated (no NVIDIA GPU on the machine).')
MODELS = EnvVar("GPUSLICE_MODELS", "Comma-separated ids of the models mounted in the server.")
MODELS_DIR = EnvVar("GPUSLICE_MODELS_DIR", "The folder in the server where the models are mounted.")

ALL: tuple[EnvVar, ...] = tuple(v for v in globals().values() if isinstance(v, EnvVar))
