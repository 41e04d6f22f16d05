"""What has a horizon is renewed by the platform itself, and each renewal is visible.

Two tasks, run by the ``renewals`` service the hub starts (``python -m hub.renewals``):

- ``alertmanager-config``, daily: the Alertmanager config written again for today (the
  on-call rotation's turns are written out 26 weeks ahead; renewed every day, they never run
  out) and Alertmanager told to reload it. A changed webhook URL file is picked up too.
- ``idle-notices``, weekly, when ``notice_mail.weekly`` is on: last ISO week's idle-holder
  notices written to ``DATA/notices/WEEK/`` and mailed, once per week (the admin's cron is
  no longer needed).

Each task's last success (or, before its first, when it was first scheduled) and interval
are kept in ``DATA/renewals.json`` and served by the hub at /hub/metrics
(``gpuslice_renewal_last_success_timestamp_seconds``, ``gpuslice_renewal_interval_seconds``);
the ``RenewalOverdue`` alert fires when one is late (docs/runbook.md).

On Kubernetes the chart runs each task as a CronJob of its own and kube-state-metrics reports
them: ``gpuslice oncall-config --write-secret`` for the Alertmanager config
(hub/alertmanager_secret.py), and ``python -m hub.renewals --once idle-notices --kube-values
FILE`` for the notices, the same ``Notices`` as here, once per run.

The schedule is pure (``due``, ``run_due``): tests drive it with a clock across months.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import smtplib
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hub.settings import MONITORING_USER, NoticeMail, Settings, load
from hub.systemd import Systemd
from spawner.quotas import GroupRules

if TYPE_CHECKING:
    from hub.kube_values import KubeValues

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
CONFIG_TASK = "alertmanager-config"
NOTICES_TASK = "idle-notices"
log = logging.getLogger("gpuslice.renewals")


@dataclass(frozen=True)
class TaskState:
    """One task's record: its interval, when it was first scheduled, its last success, its last error."""

    interval_s: float
    scheduled: float
    last_success: float | None = None
    error: str = ""
    done_for: str = ""  # what the last success covered (the ISO week of the notices)


@dataclass(frozen=True)
class Task:
    """``run(now)`` does the work and returns what it covered; ``period(now)`` names the period it is
    due for (a task runs once per period: a date, an ISO week)."""

    name: str
    interval_s: float
    period: Callable[[datetime], str]
    run: Callable[[datetime], str]


def daily(now: datetime) -> str:
    return now.date().isoformat()


def last_week(now: datetime) -> str:
    """The ISO week the weekly notice is about: the one before ``now``'s."""
    year, week, _ = (now - timedelta(weeks=1)).isocalendar()
    return f"{year}-W{week:02d}"


def due(task: Task, state: TaskState | None, now: datetime) -> bool:
    """Not yet done for ``now``'s period (a failure is tried again at the next check)."""
    return state is None or state.done_for != task.period(now)


def run_due(tasks: Iterable[Task], states: Mapping[str, TaskState], now: datetime) -> dict[str, TaskState]:
    """Each due task run once; the states after it (a failure keeps the last success and says why)."""
    after = dict(states)
    for task in tasks:
        state = after.get(task.name) or TaskState(task.interval_s, now.timestamp())
        state = replace(state, interval_s=task.interval_s)
        if due(task, after.get(task.name), now):
            try:
                covered = task.run(now)
            except Exception as exc:  # any failure: recorded, shown by the metric's age and the log
                log.warning("gpuslice renewals: %s failed: %s", task.name, exc)
                state = replace(state, error=f"{type(exc).__name__}: {exc}")
            else:
                state = replace(state, last_success=now.timestamp(), error="", done_for=covered)
        after[task.name] = state
    return after


def load_states(path: Path) -> dict[str, TaskState]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {name: TaskState(**fields) for name, fields in raw.items()}


def save_states(path: Path, states: Mapping[str, TaskState]) -> None:
    """Written whole and renamed into place: the hub's scrape never reads half a file."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({name: s.__dict__ for name, s in states.items()}, indent=1))
    os.replace(temporary, path)


class RenewalCollector(Collector):
    """The tasks' last success and interval, read from the state file at each scrape of /hub/metrics."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        last = GaugeMetricFamily(
            "gpuslice_renewal_last_success_timestamp_seconds",
            "When each renewal (hub/renewals.py) last succeeded; before its first success, when it was scheduled.",
            labels=["task"],
        )
        interval = GaugeMetricFamily(
            "gpuslice_renewal_interval_seconds", "How often each renewal should succeed.", labels=["task"]
        )
        for name, state in sorted(load_states(self.path).items()):
            last.add_metric([name], state.last_success if state.last_success is not None else state.scheduled)
            interval.add_metric([name], state.interval_s)
        yield last
        yield interval


def register(path: Path, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve the renewals' metrics from ``path`` (once per registry: a config loaded twice adds nothing)."""
    if not any(isinstance(c, RenewalCollector) for c in list(registry._collector_to_names)):
        registry.register(RenewalCollector(path))


# The tasks' work.


def renew_alertmanager_config(
    settings: Settings, folder: Path, reload: Callable[[], None]
) -> Callable[[datetime], str]:
    from hub import monitoring  # lazy: the service's only heavy import

    def run(now: datetime) -> str:
        monitoring.write_alertmanager_config(settings.monitoring, folder, now.date())
        reload()
        return daily(now)

    return run


def alertmanager_reload(url: str, auth: tuple[str, str] | None) -> Callable[[], None]:
    """Alertmanager reads its config file again (POST /-/reload); an invalid one is refused and kept out."""

    def reload() -> None:
        response = requests.post(f"{url}/-/reload", auth=auth, timeout=30)
        if response.status_code != 200:
            raise RuntimeError(
                f"Alertmanager refused the new config: HTTP {response.status_code} {response.text[:300]}"
            )

    return reload


def unit_reload(unit: str, systemd: Systemd) -> Callable[[], None]:
    """The installed service's Alertmanager: its unit's reload writes its copy of the config again, from the
    settings as of today, and signals it (hub/service_units.py); a config it refuses fails the reload."""
    return lambda: systemd.reload(unit)


QueryRange = Callable[[str, datetime, datetime, str], list[dict]]  # type: ignore[type-arg]
Mailer = Callable[[Mapping[str, str], str, NoticeMail], list[str]]


@dataclass
class Notices:
    """Last week's idle-holder notices, from Prometheus, into ``folder`` and through the relay.

    It needs Prometheus's history (the hub's allocations, the exporter's per-process memory and
    the cards' utilization), the classes (for the class column) and the relay: no ledger, no hub
    API, so it runs wherever Prometheus can be reached."""

    groups: Sequence[GroupRules]
    relay: NoticeMail
    folder: Path
    query_range: QueryRange
    mail: Mailer
    step_s: int = 300

    def __call__(self, now: datetime) -> str:
        from hub.cli import write_notices
        from spawner import usage

        week = last_week(now)
        start = now - timedelta(weeks=2)
        samples = usage.samples_from_prometheus(self.query_range, start, now, self.step_s)
        rows = usage.usage(samples, self.step_s, usage.group_members(self.groups))
        notices = usage.idle_notices(rows, week, self.relay.min_idle_hours)
        write_notices(notices, self.folder / week)
        sent = self.mail(notices, week, self.relay)
        log.warning("gpuslice renewals: %d idle-holder notices for %s mailed", len(sent), week)
        return week


def smtp_mailer(notices: Mapping[str, str], week: str, relay: NoticeMail) -> list[str]:
    from hub import mail

    host, port = relay.smtp_smarthost.rsplit(":", 1)
    with smtplib.SMTP(host, int(port), timeout=30) as smtp:
        mail.secure(smtp, relay)
        return mail.send_notices(notices, week, relay, smtp)


def tasks_for(
    settings: Settings,
    data_dir: Path,
    query_range: QueryRange,
    mailer: Mailer = smtp_mailer,
    reload: Callable[[], None] | None = None,
) -> list[Task]:
    """The renewals this platform needs: its Alertmanager config when monitoring is on, the notices when asked.
    ``reload``: how Alertmanager takes the renewed config (default: its HTTP reload, as `gpuslice up` runs it)."""
    folder = data_dir / "monitoring"
    password = (folder / "web-password").read_text().strip() if (folder / "web-password").exists() else None
    tasks = []
    if settings.monitoring.enabled and (folder / "alertmanager.yml").exists():
        url = f"http://127.0.0.1:{settings.monitoring.alertmanager_port}"
        reload = reload or alertmanager_reload(url, (MONITORING_USER, password) if password else None)
        tasks.append(Task(CONFIG_TASK, DAY_S, daily, renew_alertmanager_config(settings, folder, reload)))
    relay = settings.notice_mail
    if relay is not None and relay.weekly:
        notices = Notices(settings.groups, relay, data_dir / "notices", query_range, mailer)
        tasks.append(Task(NOTICES_TASK, WEEK_S, last_week, notices))
    return tasks


def prometheus_query_range(settings: Settings, data_dir: Path) -> QueryRange:
    from prometheus_api_client import PrometheusConnect

    password = data_dir / "monitoring" / "web-password"
    auth = (MONITORING_USER, password.read_text().strip()) if password.exists() else None
    prom = PrometheusConnect(f"http://127.0.0.1:{settings.monitoring.prometheus_port}", auth=auth, disable_ssl=True)
    return prom.custom_query_range  # type: ignore[no-any-return]


def state_path(data_dir: Path) -> Path:
    return data_dir / "renewals.json"


def kube_notices(values: KubeValues, folder: Path, query_range: QueryRange, mailer: Mailer = smtp_mailer) -> Notices:
    """The chart's CronJob (templates/monitoring/idle-notices.yaml): the notices of the chart's noticeMail, from
    its monitoring.prometheusUrl. The CronJob is its schedule and kube-state-metrics its record: one run, no state."""
    relay = values.notice_mail
    if relay is None or not relay.weekly:
        raise SystemExit("gpuslice renewals: noticeMail.weekly is off in the chart's values: nothing to mail")
    if not values.prometheus_url:
        raise SystemExit("gpuslice renewals: the notices need Prometheus's history: set monitoring.prometheusUrl")
    return Notices(values.groups, relay, folder, query_range, mailer)


def run_once_on_kubernetes(values_path: Path, folder: Path) -> int:
    from prometheus_api_client import PrometheusConnect

    from hub.kube_values import KubeValuesError, load_kube_values

    try:
        values = load_kube_values(values_path)
    except KubeValuesError as exc:
        print(f"gpuslice renewals: {exc}", file=sys.stderr)
        return 2
    query_range = PrometheusConnect(values.prometheus_url or "http://unset", disable_ssl=False).custom_query_range
    notices = kube_notices(values, folder, query_range)
    try:
        notices(datetime.now(UTC))
    except Exception as exc:  # the Job fails: kube-state-metrics records no success, RenewalOverdue follows
        print(f"gpuslice renewals: {NOTICES_TASK} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hub.renewals", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the settings file (none: the defaults)")
    parser.add_argument("--data-dir", type=Path, help="the platform's data folder (the service; not with --once)")
    parser.add_argument("--check-every", type=float, default=300.0, help="seconds between looks at what is due")
    parser.add_argument(
        "--once", choices=[NOTICES_TASK], help="on Kubernetes (the chart's CronJob): run this task once and exit"
    )
    parser.add_argument("--kube-values", type=Path, help="with --once: the chart's values (the hub ConfigMap)")
    parser.add_argument(
        "--alertmanager-unit", help="the installed service's Alertmanager unit: reloaded through systemd"
    )
    parser.add_argument(
        "--notices-dir", type=Path, default=Path("/tmp/notices"), help="with --once: where the notices are written"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.once:
        if not args.kube_values:
            parser.error("--once needs --kube-values")
        raise SystemExit(run_once_on_kubernetes(args.kube_values, args.notices_dir))
    if not args.data_dir:
        parser.error("--data-dir is needed (or --once on Kubernetes)")
    settings = load(args.config)
    reload = unit_reload(args.alertmanager_unit, Systemd()) if args.alertmanager_unit else None
    tasks = tasks_for(settings, args.data_dir, prometheus_query_range(settings, args.data_dir), reload=reload)
    log.warning("gpuslice renewals: %s", ", ".join(t.name for t in tasks) or "nothing to renew")
    path = state_path(args.data_dir)
    while True:
        states = load_states(path)
        # Tasks no longer configured leave the file (and the metric) rather than look overdue forever.
        states = {name: s for name, s in states.items() if name in {t.name for t in tasks}}
        save_states(path, run_due(tasks, states, datetime.now(UTC)))
        time.sleep(args.check_every)


if __name__ == "__main__":
    main()
