"""Renewals with the real Alertmanager, Prometheus and an SMTP server (hub/renewals.py).

A rotation whose 26 weeks ran out is renewed and reloaded into a running Alertmanager, and
the person on call today is paged again; the weekly idle-holder notice goes out once a week
for three simulated weeks, from a real Prometheus holding those weeks' history.
"""

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from aiosmtpd.controller import Controller

from bench.backfill import create_blocks
from hub import renewals
from hub.monitoring import write_alertmanager_config
from hub.renewals import NOTICES_TASK, Notices, Task, TaskState, run_due
from hub.settings import from_mapping
from spawner.ports import free_port
from tests.e2e.alerting import Webhook, wait_for

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(
    not (ALERTMANAGER and shutil.which("prometheus") and shutil.which("promtool")),
    reason="Prometheus or Alertmanager is missing: apt-get install prometheus prometheus-alertmanager",
)
GiB = 1024**3


def start(binary: str, config: Path, port: int, data: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def covers(config: dict[str, Any], person: str, day: date) -> bool:
    """Whether ``person``'s on-call interval in an Alertmanager config includes ``day``."""
    for interval in config.get("time_intervals") or []:
        if interval["name"] != f"oncall-{person}":
            continue
        for span in interval["time_intervals"]:
            if [str(day.year)] != span.get("years") or [str(day.month)] != span.get("months"):
                continue
            first, _, last = str(span["days_of_month"][0]).partition(":")
            if int(first) <= day.day <= int(last or first):
                return True
    return False


def _up(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).ok
    except requests.ConnectionError:
        return False


def test_a_rotation_that_ran_out_renews_itself_and_pages_todays_person(tmp_path: Path) -> None:
    hooks = {name: Webhook() for name in ("alice", "carol")}
    today = datetime.now(UTC).date()
    port = free_port()
    raw = {
        "monitoring": {
            "alertmanager_port": port,
            "recorder_port": free_port(),
            "oncall": {
                # alice alone on the first line (on call whatever the date: no midnight in the test),
                # carol the second line an hour later (she must not hear of it here).
                "rotation": [{"name": "alice", "webhook_url": hooks["alice"].url}],
                "second_line": {"name": "carol", "webhook_url": hooks["carol"].url},
                "first_page_after": "1s",
                "escalate_after": "1h",
                "group_interval": "1s",
            },
        }
    }
    settings = from_mapping(raw, "test")
    folder = tmp_path / "monitoring"
    folder.mkdir()
    # Written by a `gpuslice up` 27 weeks ago and never again: its turns ended a week ago.
    config = write_alertmanager_config(settings.monitoring, folder, today - timedelta(weeks=27))
    written = yaml.safe_load(config.read_text())
    last_day = max(
        datetime(int(r["years"][0]), int(r["months"][0]), int(r["days_of_month"][0].split(":")[1])).date()
        for i in written["time_intervals"]
        if i["name"].startswith("oncall-")
        for r in i["time_intervals"]
        if "months" in r
    )
    assert last_day < today  # nobody is on call any more
    assert ALERTMANAGER
    server = start(ALERTMANAGER, config, port, tmp_path / "am-data", tmp_path / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(f"{url}/-/ready"), "Alertmanager", 30)
        task = Task(
            renewals.CONFIG_TASK,
            renewals.DAY_S,
            renewals.daily,
            renewals.renew_alertmanager_config(settings, folder, renewals.alertmanager_reload(url, None)),
        )
        states = run_due([task], {}, datetime.now(UTC))  # what the renewals service does at its next look
        assert states[renewals.CONFIG_TASK].last_success is not None, states
        loaded = yaml.safe_load(requests.get(f"{url}/api/v2/status", timeout=5).json()["config"]["original"])
        assert covers(loaded, "alice", today) and covers(loaded, "alice", today + timedelta(weeks=25))
        on_call = "alice"
        now = datetime.now(UTC)
        alert = {
            "labels": {"alertname": "NodeDown", "severity": "critical", "node": "n1"},
            "annotations": {"summary": "renewed"},
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=5)).isoformat(),
        }
        requests.post(f"{url}/api/v2/alerts", json=[alert], timeout=5).raise_for_status()
        wait_for(lambda: hooks[on_call].received, f"{on_call} (on call today) to be paged", 30)
        assert all(not hooks[n].received for n in hooks if n != on_call)
    finally:
        server.terminate()
        server.wait(timeout=10)
        for hook in hooks.values():
            hook.server.shutdown()


class Inbox:
    def __init__(self) -> None:
        self.received: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        from email import message_from_bytes

        self.received.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


def history(end_s: int, weeks: int) -> str:
    """``weeks`` weeks of two users on one 16 GiB card, a sample every 5 minutes: ann holds 8 GiB and
    never computes, bob holds 8 GiB and computes (busy card, a process)."""
    step = 300
    first = end_s - weeks * 7 * 86400
    lines = ["# TYPE gpuslice_gpu_memory_capacity_bytes gauge"]
    times = range(first, end_s, step)
    lines += [f'gpuslice_gpu_memory_capacity_bytes{{node="n1",gpu="0"}} {16 * GiB} {t}' for t in times]
    lines.append("# TYPE gpuslice_gpu_memory_allocated_bytes gauge")
    for user in ("ann", "bob"):
        lines += [
            f'gpuslice_gpu_memory_allocated_bytes{{node="n1",gpu="0",user="{user}",server=""}} {8 * GiB} {t}'
            for t in times
        ]
    lines.append("# TYPE DCGM_FI_DEV_GPU_UTIL gauge")
    lines += [f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",gpu="0"}} 80 {t}' for t in times]
    lines.append("# TYPE gpuslice_process_gpu_memory_bytes gauge")
    lines += [
        f'gpuslice_process_gpu_memory_bytes{{Hostname="n1",gpu="0",user="bob",server="",pid="7"}} {4 * GiB} {t}'
        for t in times
    ]
    return "\n".join([*lines, "# EOF", ""])


@contextmanager
def prometheus_with_history(tmp_path: Path, end_s: int) -> Iterator[str]:
    """A real Prometheus holding five weeks of ``history`` up to ``end_s``: its URL."""
    (tmp_path / "data.om").write_text(history(end_s, weeks=5))
    backfill = create_blocks(tmp_path / "data.om", tmp_path / "tsdb")
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    prom_port = free_port()
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--storage.tsdb.retention.time=60d",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _up(f"http://127.0.0.1:{prom_port}/-/ready"), "Prometheus", 60)
        yield f"http://127.0.0.1:{prom_port}"
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


@contextmanager
def smtp_relay() -> Iterator[tuple[Inbox, int]]:
    inbox, smtp_port = Inbox(), free_port()
    relay = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    relay.start()
    try:
        yield inbox, smtp_port
    finally:
        relay.stop()


def test_the_weekly_notice_goes_out_once_a_week_for_three_weeks(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    end_s = int(now.timestamp()) // 300 * 300
    with prometheus_with_history(tmp_path, end_s) as prometheus_url, smtp_relay() as (inbox, smtp_port):
        from prometheus_api_client import PrometheusConnect

        query = PrometheusConnect(prometheus_url, disable_ssl=True).custom_query_range
        settings = from_mapping(
            {
                "notice_mail": {
                    "smtp_smarthost": f"127.0.0.1:{smtp_port}",
                    "smtp_from": "gpuslice@example.org",
                    "address": "{user}@students.example.org",
                    "weekly": True,
                }
            },
            "test",
        )
        [task] = renewals.tasks_for(settings, tmp_path, query)  # no Alertmanager here: the notices alone
        assert isinstance(task.run, Notices) and task.name == NOTICES_TASK
        # Three simulated weeks, a look every six hours from the start of the Monday three weeks ago until
        # now. The looks fall on each Monday's midnight, so the last one is never after now: a run early on
        # a Monday (CI's at 00:28 was) still looks in this week.
        monday = (now - timedelta(days=now.weekday(), weeks=3)).replace(hour=0, minute=0, second=0, microsecond=0)
        clock, states = monday, dict[str, TaskState]()
        while clock <= now:
            states = run_due([task], states, clock)
            clock += timedelta(hours=6)
        weeks = [renewals.last_week(monday + timedelta(weeks=i)) for i in range(4)]
        subjects = [message["Subject"] for _, message in inbox.received]
        assert subjects == [f"Your idle GPU slices in {week}" for week in weeks], subjects
        assert {to for recipients, _ in inbox.received for to in recipients} == {"ann@students.example.org"}
        assert states[NOTICES_TASK].done_for == weeks[-1] and states[NOTICES_TASK].error == ""
        assert sorted(p.name for p in (tmp_path / "notices").iterdir()) == weeks  # the files too, per week


def test_the_charts_cronjob_mails_last_weeks_notice_from_the_charts_values(tmp_path: Path) -> None:
    """What the CronJob <release>-gpuslice-idle-notices runs, with the hub ConfigMap helm renders from noticeMail."""
    from tests.helm.test_chart import run_helm
    from tests.helm.test_kube_values import rendered_values

    if run_helm("version").returncode != 0:
        pytest.skip("helm is missing: run scripts/setup")
    now = datetime.now(UTC)
    with prometheus_with_history(tmp_path, int(now.timestamp()) // 300 * 300) as prometheus_url:
        with smtp_relay() as (inbox, smtp_port):
            relay = {
                "smtp_smarthost": f"127.0.0.1:{smtp_port}",
                "smtp_from": "gpuslice@example.org",
                "address": "{user}@students.example.org",
                "weekly": True,
            }
            values = rendered_values(tmp_path, {"noticeMail": relay, "monitoring": {"prometheusUrl": prometheus_url}})
            job = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hub.renewals",
                    "--once=idle-notices",
                    f"--kube-values={values}",
                    f"--notices-dir={tmp_path / 'notices'}",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert job.returncode == 0, job.stderr
            week = renewals.last_week(now)
            assert [message["Subject"] for _, message in inbox.received] == [f"Your idle GPU slices in {week}"]
            assert inbox.received[0][0] == ["ann@students.example.org"]  # bob computed: no notice
            assert sorted(p.name for p in (tmp_path / "notices" / week).iterdir()) == ["ann.txt"]
        # The relay gone: the run fails (the Job fails, kube-state-metrics records no success).
        failed = subprocess.run(
            [
                sys.executable,
                "-m",
                "hub.renewals",
                "--once=idle-notices",
                f"--kube-values={values}",
                f"--notices-dir={tmp_path / 'again'}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert failed.returncode == 1 and "idle-notices failed" in failed.stderr, failed.stderr
