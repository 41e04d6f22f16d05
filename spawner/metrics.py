"""The spawners' own Prometheus metrics, served beside JupyterHub's at the hub's /hub/metrics.

Defined here, below the hub, so the spawners count without importing the hub; label
values are created up front so each series exists before its first event (as
JupyterHub's metrics.py does). The hub's collectors live in hub/metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge

REFUSAL_REASONS = ("invalid", "quota", "capacity", "line")

SPAWN_REFUSED = Counter(
    "gpuslice_spawn_refused_total",
    "Spawns refused before anything was allocated, by reason: invalid (bad options), "
    "quota (a group rule), capacity (no GPU can hold the slice now), line (others wait before it, "
    "or it waited longer than the line allows).",
    ["reason"],
)
# The refusals whose answer offers the GPU line (no room now, a class budget spent, others
# waiting): a class's normal day, not a failure of the platform; SpawnFailureRateHigh counts
# neither these nor any refusal (hub/monitoring/alerts.yml).
SPAWN_OFFERED_LINE = Counter(
    "gpuslice_spawn_offered_line_total",
    "Refused spawns whose answer offered to wait in the GPU line, by the refusal's reason.",
    ["reason"],
)
for _reason in REFUSAL_REASONS:
    SPAWN_REFUSED.labels(reason=_reason)
    SPAWN_OFFERED_LINE.labels(reason=_reason)

# One machine's turns to start (spawner/start_turns.py): many waiting for long is a machine too small
# for its classes' mornings, or a server that hangs before it answers and holds its turn.
SERVER_STARTS = Gauge(
    "gpuslice_server_starts",
    "Notebook servers starting on this machine: state=starting (launched, not answering yet), "
    "state=waiting (waiting for their turn to start; concurrent_starts).",
    ["state"],
)


def follow_turns(starting: Callable[[], float], waiting: Callable[[], float]) -> None:
    """Report the hub's turns to start (read at each scrape)."""
    SERVER_STARTS.labels(state="starting").set_function(starting)
    SERVER_STARTS.labels(state="waiting").set_function(waiting)
