"""Utilization reports on literal samples; the PromQL against the real Prometheus over backfilled data."""

import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_api_client import PrometheusConnect

from hub.cli import write_notices
from spawner.quotas import read_groups
from spawner.usage import (
    Sample,
    UsageRow,
    by_group,
    group_members,
    idle_notices,
    iso_week,
    samples_from_prometheus,
    to_csv,
    trend,
    usage,
    worst_holders,
)
from tests.e2e.alerting import wait_for
from tests.e2e.platform import free_port

needs_prometheus = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="Prometheus is missing: scripts/setup installs it (apt-get install prometheus)",
)
MONDAY = datetime(2026, 11, 23, 9, tzinfo=UTC).timestamp()  # ISO week 2026-W48
NEXT_WEEK = MONDAY + 7 * 86400


def slice_at(t: float, user: str, share: float, used: bool) -> Sample:
    return Sample(t, user, "", "n1", "0", share, used)


def test_gpu_hours_allocated_used_and_idle_per_user_and_week() -> None:
    samples = [
        # ann holds half a card for 4 hours, busy for 1 of them.
        *(slice_at(MONDAY + h * 3600, "ann", 0.5, h == 0) for h in range(4)),
        # bob holds a whole card for 2 hours, all busy; and 1 idle hour next week.
        *(slice_at(MONDAY + h * 3600, "bob", 1.0, True) for h in range(2)),
        slice_at(NEXT_WEEK, "bob", 1.0, False),
    ]
    rows = usage(samples, step_s=3600, group_of={"ann": "cs101"})
    assert rows == [
        UsageRow("2026-W48", "ann", "cs101", 2.0, 0.5),
        UsageRow("2026-W48", "bob", "", 2.0, 2.0),
        UsageRow("2026-W49", "bob", "", 1.0, 0.0),
    ]
    assert rows[0].idle_h == 1.5 and rows[0].used_ratio == 0.25
    assert worst_holders(rows, "2026-W48") == [rows[0]]  # bob used all he held
    assert trend(rows) == [("2026-W48", 4.0, 2.5), ("2026-W49", 1.0, 0.0)]
    assert by_group(rows) == [
        UsageRow("2026-W48", "*", "", 2.0, 2.0),
        UsageRow("2026-W48", "*", "cs101", 2.0, 0.5),
        UsageRow("2026-W49", "*", "", 1.0, 0.0),
    ]


def test_the_weekly_notice_goes_to_idle_holders_of_that_week_only(tmp_path: Path) -> None:
    rows = [
        UsageRow("2026-W48", "ann", "cs101", 10.0, 2.5),  # 7.5 h idle: a notice
        UsageRow("2026-W48", "bob", "", 3.0, 2.0),  # 1 h idle: under the 2 h line
        UsageRow("2026-W47", "cid", "", 9.0, 0.0),  # another week
        UsageRow("2026-W48", "*", "cs101", 10.0, 2.5),  # a class total, not a person
    ]
    notices = idle_notices(rows, "2026-W48", min_idle_h=2)
    assert notices == {
        "ann": "Hello ann,\n\n"
        "in 2026-W48 your notebook servers held 10.0 GPU-hours of GPU slices and used 2.5 (25% of it);"
        " 7.5 GPU-hours were held without running anything on the GPU.\n"
        "A held slice is GPU memory nobody else can have, and others wait for it. Please stop your server"
        " when you are not computing (File > Hub Control Panel > Stop My Server) and start it again when"
        " you need it: your files stay.\n\n"
        "(A GPU-hour is one whole card for an hour; this notice goes to everyone who held at least"
        " 2 GPU-hours idle in a week.)\n"
    }
    [path] = write_notices(notices, tmp_path / "2026-W48")
    assert path == tmp_path / "2026-W48" / "ann.txt" and path.read_text() == notices["ann"]
    with pytest.raises(ValueError, match="not a plain file name"):
        write_notices({"../etc/x": "text"}, tmp_path)


def test_csv_has_a_header_and_one_line_per_row() -> None:
    text = to_csv([UsageRow("2026-W48", "ann", "cs101", 2.0, 0.5)])
    assert text == (
        "week,user,class,gpu_hours_allocated,gpu_hours_used,gpu_hours_idle_held\n2026-W48,ann,cs101,2.000,0.500,1.500\n"
    )


def test_iso_weeks_and_class_membership() -> None:
    assert iso_week(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) == "2026-W01"
    assert iso_week(datetime(2027, 1, 1, tzinfo=UTC).timestamp()) == "2026-W53"
    groups = read_groups([{"name": "cs101", "members": ["ann", "bob"]}, {"name": "ml", "members": ["bob"]}])
    assert group_members(groups) == {"ann": "cs101", "bob": "cs101"}


def openmetrics(start: int) -> str:
    """An hour of one card shared by ann (busy for 30 minutes) and bob (no process at all)."""
    gib = 1024**3
    families: dict[str, tuple[str, list[tuple[str, list[float]]]]] = {
        "gpuslice_gpu_memory_capacity_bytes": (
            "gauge",
            [('node="n1",gpu="0",model="T4",simulated="true"', [16.0 * gib] * 60)],
        ),
        "gpuslice_gpu_memory_allocated_bytes": (
            "gauge",
            [
                ('node="n1",gpu="0",user="ann",server=""', [8.0 * gib] * 60),
                ('node="n1",gpu="0",user="bob",server="big"', [8.0 * gib] * 60),
            ],
        ),
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", [('gpu="0",Hostname="n1"', [50.0] * 30 + [0.0] * 30)]),
        "gpuslice_process_gpu_memory_bytes": (
            "gauge",
            [('gpu="0",Hostname="n1",user="ann",server="",pid="7"', [2.0 * gib] * 60)],
        ),
    }
    lines = []
    for name, (kind, series) in families.items():
        lines.append(f"# TYPE {name} {kind}")
        for labels, values in series:
            lines += [f"{name}{{{labels}}} {v} {start + 60 * i}" for i, v in enumerate(values)]
    return "\n".join([*lines, "# EOF", ""])


@pytest.mark.process
@needs_prometheus
def test_the_report_queries_give_the_same_hours_from_the_real_prometheus(tmp_path: Path) -> None:
    # An hour that starts on the hour, three hours back: it never spans a Monday midnight (the report's
    # weeks), where one that began at any minute did when the test ran early on a Monday.
    start = int(time.time()) // 3600 * 3600 - 3 * 3600
    (tmp_path / "data.om").write_text(openmetrics(start))
    backfill = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "data.om"), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    with subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as prometheus:
        try:
            prom = PrometheusConnect(f"http://127.0.0.1:{port}")
            wait_for(lambda: _ready(prom), "Prometheus to start", 60)
            first, last = (datetime.fromtimestamp(t, UTC) for t in (start, start + 59 * 60))
            samples = samples_from_prometheus(prom.custom_query_range, first, last, 60)
        finally:
            prometheus.terminate()
    rows = usage(samples, step_s=60, group_of={"ann": "cs101"})
    week = iso_week(start)
    assert rows == [UsageRow(week, "ann", "cs101", 0.5, 0.25), UsageRow(week, "bob", "", 0.5, 0.0)]


def _ready(prom: PrometheusConnect) -> bool:
    try:
        return bool(prom.check_prometheus_connection())
    except Exception:
        return False
