"""Scale benchmark (printed, not a timed test): 1,000 nodes, 8,000 GPUs, 10,000 servers.

The data layer runs for real against a fake Prometheus that counts PromQL queries and
answers with one series per GPU; the pages render with Streamlit's AppTest.
"""

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from portal import auth
from portal.data import prometheus
from portal.data.hub import ServerRow
from portal.identity import Identity
from portal.sources import alerts, classes, metrics, servers
from spawner.inventory import Allocation, Gpu, Inventory, Node
from spawner.ledger import Held
from tests.portal.line_hub import serve_line

pytestmark = pytest.mark.pages  # Streamlit pages run by AppTest: not in the fast tier

APP = str(Path(__file__).parents[2] / "portal" / "app.py")
GiB = 2**30
NODES, PER_NODE, SERVERS = 1000, 8, 10_000


class CountingPrometheus:
    def __init__(self) -> None:
        self.queries = 0
        now = time.time()
        names = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"]
        self.vector = [
            {"metric": {"__name__": name, "Hostname": f"node{n:04d}", "gpu": str(g)}, "value": [now, "42"]}
            for n in range(NODES)
            for g in range(PER_NODE)
            for name in names
        ]

    def custom_query(self, query: str) -> Any:
        self.queries += 1
        if query.startswith('{__name__=~"DCGM'):
            return self.vector
        return [{"metric": {"__name__": "gpuslice:gpu_utilization:avg"}, "value": [0, "42"]}]

    def custom_query_range(self, query: str, **kwargs: Any) -> Any:
        self.queries += 1
        values = [[1795324800 + 30 * i, "1"] for i in range(120)]
        if "avg by (Hostname)" in query:  # the heatmap, one row per node
            return [{"metric": {"Hostname": f"node{n:04d}", "gpu": "all"}, "values": values} for n in range(NODES)]
        return [{"metric": {}, "values": values}]


def synthetic() -> tuple[Inventory, list[Held], list[ServerRow]]:
    holds, nodes = [], []
    for n in range(NODES):
        gpus = []
        for g in range(PER_NODE):
            gpu = Gpu(f"node{n:04d}", g, "A100", 80 * GiB)
            for s in range(
                SERVERS // (NODES * PER_NODE) + (1 if (n * PER_NODE + g) < SERVERS % (NODES * PER_NODE) else 0)
            ):
                user = f"u{n * PER_NODE + g}-{s}"
                gpu.allocations.append(Allocation(user, "", 10 * GiB, f"{user}/"))
                holds.append(Held(f"{user}/", g, user, "", 10 * GiB, group=f"class{n % 50}"))
            gpus.append(gpu)
        nodes.append(Node(f"node{n:04d}", 128_000, 1024 * GiB, gpus))
    now = datetime.now(UTC)
    servers = [ServerRow(h.user, "", "running", "10GiB", 0, "default", now, now) for h in holds]
    return Inventory(nodes), holds, servers


@pytest.mark.slow
def test_pages_at_cluster_scale(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    inventory, holds, rows = synthetic()
    assert sum(len(n.gpus) for n in inventory.nodes) == 8000 and len(rows) == SERVERS
    prom = CountingPrometheus()
    monkeypatch.setattr(auth, "require_identity", lambda: Identity("admin", admin=True))
    monkeypatch.setattr(servers, "_all_inventory", lambda: (inventory, holds))
    monkeypatch.setattr(servers, "servers", lambda identity: rows)
    monkeypatch.setattr(servers, "server_counts", lambda: {"running": len(rows), "starting": 0, "users": SERVERS})
    monkeypatch.setattr(classes, "groups", lambda: {f"class{i}": [h.user for h in holds[i::50]] for i in range(50)})
    monkeypatch.setattr(metrics, "gpu_readings", lambda: prometheus.gpu_readings(prom))  # type: ignore[arg-type]
    monkeypatch.setattr(metrics, "summary", lambda: prometheus.summary(prom))  # type: ignore[arg-type]
    monkeypatch.setattr(metrics, "trend", lambda expr, hours: prometheus.trend(prom, expr, hours))  # type: ignore[arg-type]
    monkeypatch.setattr(alerts, "_active_alerts", lambda: [])
    serve_line(monkeypatch, tmp_path / "ledger.sqlite", classes.group_rules, classes.groups)
    monkeypatch.setattr(classes, "_all_classes", lambda: [])
    monkeypatch.setattr(metrics, "spawn_success", lambda: prometheus.spawn_success_ratio(prom))  # type: ignore[arg-type]
    monkeypatch.setattr(
        metrics,
        "utilization_heatmap",
        lambda hours, per_node: prometheus.per_gpu_trend(prom, "avg by (Hostname)" if per_node else "x", hours),  # type: ignore[arg-type]
    )
    lines = []
    for page in [
        "screens/overview.py",
        "screens/gpus.py",
        "screens/servers.py",
        "screens/classes.py",
        "screens/alerts.py",
    ]:
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        before = prom.queries
        start = time.perf_counter()
        at.switch_page(page).run()
        seconds = time.perf_counter() - start
        assert not at.exception, at.exception
        queries = prom.queries - before
        lines.append(f"{page:22s} {seconds:6.2f} s  {queries} PromQL queries")
        assert queries <= 8
    with capsys.disabled():
        print("\nportal at 1,000 nodes / 8,000 GPUs / 10,000 servers (targets: under 2 s, at most 8 queries):")
        print("\n".join(lines))
