"""A replay's history in a real Prometheus: OpenMetrics text, ``promtool tsdb create-blocks-from
openmetrics``, and a Prometheus server started on those blocks (stopped when done).

The replay's last minute becomes ``end``: a page that asks for "the last three days" then reads
the replay, through the same queries it sends a live Prometheus.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from bench.faultgen import Replay
from spawner.ports import free_port

# dcgm-exporter writes its counters without _total; OpenMetrics would want the suffix, so they
# go in as gauges (a query reads the same samples either way).
TYPES = {"gpuslice_process_gpu_memory_bytes": "gauge", "gpuslice_gpu_memory_allocated_bytes": "gauge"}


def openmetrics(replay: Replay, end_s: int, names: Iterable[str], step_s: int = 60) -> Iterator[str]:
    """The replay's series named ``names`` as OpenMetrics lines, one family at a time, minute m at
    ``end_s - (minutes - 1 - m) * step_s``; a minute with no sample is left out."""
    wanted = set(names)
    first = end_s - (replay.minutes - 1) * step_s
    families: dict[str, list[tuple[str, list[float | None]]]] = {}
    for selector, values in replay.series.items():
        name = selector.split("{", 1)[0]
        if name in wanted:
            families.setdefault(name, []).append((selector, values))
    for name, series in sorted(families.items()):
        yield f"# TYPE {name} {TYPES.get(name, 'gauge')}\n"
        for selector, values in series:
            for m, value in enumerate(values):
                if value is not None:
                    yield f"{selector} {value:g} {first + m * step_s}\n"
    yield "# EOF\n"


# promtool cuts a backfill into two-hour blocks unless told otherwise: five weeks of history made 421
# blocks, 33 s of CPU to write, and Prometheus then opens and compacts them all. Week-long blocks take
# half a second (Prometheus's docs on backfilling: a longer block duration backfills faster and spares
# the compactions that follow). A week stays under the compactor's largest range for a 30-day retention.
BLOCK_DURATION = "168h"


def create_blocks(history: Path, tsdb: Path, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``promtool tsdb create-blocks-from openmetrics`` of ``history`` into ``tsdb``, in week-long blocks."""
    return subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"--max-block-duration={BLOCK_DURATION}",
            str(history),
            str(tsdb),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@contextmanager
def prometheus_with(replay: Replay, end_s: int, names: Iterable[str], timeout_s: float = 120) -> Iterator[str]:
    """A real Prometheus whose history is the replay's (the names given), ending at ``end_s``; its URL."""
    for tool in ("promtool", "prometheus"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} is missing: scripts/setup installs it (apt-get install prometheus)")
    with tempfile.TemporaryDirectory(prefix="gpuslice-backfill-") as folder:
        root = Path(folder)
        with (root / "history.om").open("w") as out:
            out.writelines(openmetrics(replay, end_s, names))
        blocks = create_blocks(root / "history.om", root / "tsdb")
        if blocks.returncode != 0:
            raise RuntimeError(f"promtool could not backfill: {(blocks.stdout + blocks.stderr)[-1000:]}")
        (root / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
        port = free_port()
        log = (root / "prometheus.log").open("w")
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'tsdb'}",
                "--storage.tsdb.retention.time=30d",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, server, timeout_s)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


def _wait_ready(url: str, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"Prometheus exited ({server.returncode}) before it was ready")
        try:
            if requests.get(f"{url}/-/ready", timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"Prometheus was not ready after {timeout_s:.0f} s")
