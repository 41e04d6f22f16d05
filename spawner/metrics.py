"""The spawners' own Prometheus metrics, served beside JupyterHub's at the hub's /hub/metrics.

Defined here, below the hub, so the spawners count without importing the hub; label
values are created up front so each series exists before its first event (as
JupyterHub's metrics.py does). The hub's collectors live in hub/metrics.py.
"""

from __future__ import annotations

from prometheus_client import Counter

REFUSAL_REASONS = ("invalid", "quota", "capacity")

SPAWN_REFUSED = Counter(
    "gpuslice_spawn_refused_total",
    "Spawns refused before anything was allocated, by reason: invalid (bad options), "
    "quota (a group rule), capacity (no GPU can hold the slice now).",
    ["reason"],
)
for _reason in REFUSAL_REASONS:
    SPAWN_REFUSED.labels(reason=_reason)
