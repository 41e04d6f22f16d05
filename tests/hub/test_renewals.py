"""Renewals across a simulated horizon (hub/renewals.py): a clock, the real config writer, the state file."""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from hub import renewals
from hub.renewals import CONFIG_TASK, NOTICES_TASK, RenewalCollector, Task, TaskState, run_due
from hub.settings import from_mapping

SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML was built with it

START = datetime(2026, 3, 2, 0, 30, tzinfo=UTC)  # a Monday
ROTATION = {"rotation": [{"name": "alice", "webhook_url": "http://a/"}, {"name": "bob", "webhook_url": "http://b/"}]}


def on_call(config: dict[str, Any], day: date) -> list[str]:
    """Who the config's time intervals put on call on ``day`` (what Alertmanager would route to)."""
    found = []
    for interval in config.get("time_intervals", ()):
        if not interval["name"].startswith("oncall-"):
            continue
        for span in interval["time_intervals"]:
            if "months" not in span:
                continue
            first, last = (int(d) for d in span["days_of_month"][0].split(":"))
            if (int(span["years"][0]), int(span["months"][0])) == (day.year, day.month) and first <= day.day <= last:
                found.append(interval["name"].removeprefix("oncall-"))
    return found


def expected(day: date) -> str:
    """The rotation's rule, in words: alice the week of 2026-01-05, then bob, then alice, ..."""
    return ["alice", "bob"][((day - date(2026, 1, 5)).days // 7) % 2]


def simulate(tmp_path: Path, weeks: int, renew: bool) -> list[date]:
    """Check every 12 hours for ``weeks``; the days nobody (or the wrong person) was on call."""
    settings = from_mapping({"monitoring": {"oncall": {**ROTATION, "rotation_start": "2026-01-05"}}}, "t")
    folder = tmp_path / "monitoring"
    folder.mkdir()
    renewals_done: list[datetime] = []
    reload = lambda: renewals_done.append(now)  # noqa: E731 (Alertmanager's reload, timed by the clock)
    task = Task(
        CONFIG_TASK, renewals.DAY_S, renewals.daily, renewals.renew_alertmanager_config(settings, folder, reload)
    )
    states: dict[str, TaskState] = {}
    now, wrong = START, []
    states = run_due([task], states, now)  # what gpuslice up writes at its start
    text, config = "", {}
    while now < START + timedelta(weeks=weeks):
        now += timedelta(hours=12)
        if renew:
            states = run_due([task], states, now)
        if (written := (folder / "alertmanager.yml").read_text()) != text:  # read again only once rewritten
            text, config = written, yaml.load(written, Loader=SafeLoader)
        if on_call(config, now.date()) != [expected(now.date())]:
            wrong.append(now.date())
    if renew:  # once a day, on the day's first check
        assert len(renewals_done) == weeks * 7 + 1
        assert states[CONFIG_TASK].last_success == (START + timedelta(weeks=weeks)).replace(hour=0).timestamp()
    return sorted(set(wrong))


def test_the_rotation_renews_itself_across_28_weeks(tmp_path: Path) -> None:
    assert simulate(tmp_path, weeks=28, renew=True) == []


def test_without_renewal_the_rotation_runs_out_after_26_weeks(tmp_path: Path) -> None:
    """What the platform did before: the config written at start covered 26 weeks, then nobody."""
    wrong = simulate(tmp_path, weeks=28, renew=False)
    assert wrong and START.date() + timedelta(weeks=26) < wrong[0] <= START.date() + timedelta(weeks=27)


def test_the_weekly_notice_goes_once_a_week_and_a_failure_is_tried_again() -> None:
    sent: list[tuple[datetime, str]] = []
    failing = {"week": "2026-W12"}

    def notices(now: datetime) -> str:
        week = renewals.last_week(now)
        if week == failing["week"]:
            failing["week"] = ""  # the relay is back at the next check
            raise RuntimeError("the mail relay refused the login")
        sent.append((now, week))
        return week

    task = Task(NOTICES_TASK, renewals.WEEK_S, renewals.last_week, notices)
    states: dict[str, TaskState] = {}
    now = START
    errors = []
    while now < START + timedelta(weeks=4):
        states = run_due([task], states, now)
        errors.append(states[NOTICES_TASK].error)
        now += timedelta(hours=1)
    assert [week for _, week in sent] == ["2026-W09", "2026-W10", "2026-W11", "2026-W12"]
    assert [at - START for at, _ in sent][:3] == [timedelta(0), timedelta(weeks=1), timedelta(weeks=2)]
    assert sent[3][0] - START == timedelta(weeks=3, hours=1)  # an hour late, after the failed try
    assert "RuntimeError: the mail relay refused the login" in errors


def test_each_renewal_is_a_metric_of_its_last_success(tmp_path: Path) -> None:
    path = tmp_path / "renewals.json"
    states = {
        CONFIG_TASK: TaskState(renewals.DAY_S, scheduled=100.0, last_success=5000.0),
        NOTICES_TASK: TaskState(renewals.WEEK_S, scheduled=200.0),  # never yet: counted from its scheduling
    }
    renewals.save_states(path, states)
    registry = CollectorRegistry()
    registry.register(RenewalCollector(path))

    def value(name: str, task: str) -> float | None:
        return registry.get_sample_value(name, {"task": task})

    assert value("gpuslice_renewal_last_success_timestamp_seconds", CONFIG_TASK) == 5000.0
    assert value("gpuslice_renewal_last_success_timestamp_seconds", NOTICES_TASK) == 200.0
    assert value("gpuslice_renewal_interval_seconds", NOTICES_TASK) == renewals.WEEK_S
    assert renewals.load_states(path) == states


def test_the_weekly_notice_is_a_setting_of_the_relay() -> None:
    relay = {"smtp_smarthost": "mail:25", "smtp_from": "gpuslice@example.org"}
    settings = from_mapping({"notice_mail": {**relay, "weekly": True, "min_idle_hours": 3}}, "t")
    assert settings.notice_mail is not None and settings.notice_mail.weekly
    tasks = renewals.tasks_for(settings, Path("/nonexistent"), lambda *a: [])
    assert [t.name for t in tasks] == [NOTICES_TASK]  # no Alertmanager config here: nothing else to renew
    with pytest.raises(Exception, match="min_idle_hours"):
        from_mapping({"notice_mail": {**relay, "min_idle_hours": -1}}, "t")


def test_the_charts_notice_job_takes_the_classes_and_relay_of_the_values_and_refuses_what_cannot_work() -> None:
    from hub.kube_values import KubeValues

    base = {"notebookImage": "n", "proxyApiUrl": "http://p", "groups": {"ml101": {"members": ["ann"]}}}
    relay = {"smtp_smarthost": "mail:25", "smtp_from": "gpuslice@example.org", "weekly": True}
    values = KubeValues.model_validate({**base, "prometheusUrl": "http://prom:9090", "noticeMail": relay})
    notices = renewals.kube_notices(values, Path("/tmp/n"), lambda *a: [], lambda *a: [])
    assert notices.relay == values.notice_mail and [g.name for g in notices.groups] == ["ml101"]
    not_weekly = KubeValues.model_validate(
        {**base, "prometheusUrl": "http://p", "noticeMail": {**relay, "weekly": False}}
    )
    with pytest.raises(SystemExit, match=r"noticeMail\.weekly is off"):
        renewals.kube_notices(not_weekly, Path("/tmp/n"), lambda *a: [])
    with pytest.raises(SystemExit, match=r"set monitoring\.prometheusUrl"):
        renewals.kube_notices(KubeValues.model_validate({**base, "noticeMail": relay}), Path("/tmp/n"), lambda *a: [])
