"""On-call settings and the Alertmanager routes built from them (literals; amtool checks the result)."""

import shutil
import subprocess
from datetime import date
from pathlib import Path

import pytest
import yaml

from hub.monitoring import SecretFileError, alertmanager_config
from hub.monitoring.oncall import date_ranges, days_off, rotation_turns
from hub.settings import Contact, OnCall, SettingsError, from_mapping

ALICE = Contact(name="alice", webhook_url="http://chat/alice")
BOB = Contact(name="bob", email="bob@example.org")
CAROL = Contact(name="carol", webhook_url="http://chat/carol")
DAVE = Contact(name="dave", webhook_url="http://pager/dave")


def test_turns_follow_the_rotation_from_its_start() -> None:
    mail = {"smtp_smarthost": "mail:25", "smtp_from": "alerts@example.org"}  # bob is mailed
    oncall = OnCall(rotation=(ALICE, BOB), rotation_days=7, rotation_start=date(2026, 1, 5), **mail)
    turns = rotation_turns(oncall, today=date(2026, 1, 14), horizon_days=14)
    assert [(c.name, a, b) for c, a, b in turns] == [
        ("bob", date(2026, 1, 12), date(2026, 1, 18)),
        ("alice", date(2026, 1, 19), date(2026, 1, 25)),
        ("bob", date(2026, 1, 26), date(2026, 2, 1)),
    ]


def test_a_turn_across_a_month_end_is_two_ranges() -> None:
    assert date_ranges(date(2026, 1, 26), date(2026, 2, 1), "UTC") == [
        {"years": ["2026"], "months": ["1"], "days_of_month": ["26:31"], "location": "UTC"},
        {"years": ["2026"], "months": ["2"], "days_of_month": ["1:1"], "location": "UTC"},
    ]


def test_days_off_are_the_days_outside_the_business_range() -> None:
    assert days_off("monday:friday") == ["saturday", "sunday"]
    assert days_off("friday:monday") == ["tuesday", "wednesday", "thursday"]
    assert days_off("monday:sunday") == []


@pytest.mark.parametrize(
    ("oncall", "message"),
    [
        ({"rotation": [{"name": "bob", "email": "bob@example.org"}]}, "bob should get email: set smtp_smarthost"),
        ({"rotation": [{"name": "eve"}]}, "give eve a webhook_url (or webhook_url_file) or an email"),
        (
            {"rotation": [{"name": "eve", "webhook_url": "http://a", "webhook_url_file": "/run/eve"}]},
            "give webhook_url or webhook_url_file, not both",
        ),
        ({"escalate_after": "soon"}, "oncall.escalate_after must be a duration like 15m"),
        ({"business_hours": "9-5"}, "oncall.business_hours must be HH:MM-HH:MM"),
        (
            {"second_line": {"name": "x", "webhook_url": "chat"}},
            "oncall.second_line.webhook_url must be an http",
        ),
        ({"rotaton": []}, "oncall: unknown key(s) rotaton (did you mean rotation?)"),
        ({"smtp_auth_username": "alerts"}, "smtp_auth_username and smtp_auth_password_file go together"),
    ],
)
def test_bad_oncall_settings_say_what_to_fix(oncall: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=r"monitoring\.oncall") as error:
        from_mapping({"monitoring": {"oncall": oncall}}, "gpuslice.yaml")
    assert message in str(error.value)


def test_oncall_settings_are_read_from_the_file() -> None:
    settings = from_mapping(
        {
            "monitoring": {
                "oncall": {"rotation": [{"name": "alice", "webhook_url": "http://chat/alice"}], "rotation_days": 1}
            }
        },
        "gpuslice.yaml",
    )
    assert settings.monitoring.oncall.rotation == (ALICE,)
    assert not from_mapping({}, "x").monitoring.oncall.enabled  # no rotation: one webhook per severity, as before


def test_a_webhook_url_file_is_read_when_the_config_is_written(tmp_path: Path) -> None:
    """gpuslice.yaml may name a file (a mounted Secret, a 0600 file) instead of the URL itself."""
    hook = tmp_path / "alice"
    oncall = {"rotation": [{"name": "alice", "webhook_url_file": str(hook)}], "deadman_url_file": str(tmp_path / "dm")}
    settings = from_mapping({"monitoring": {"oncall": oncall}}, "gpuslice.yaml")
    hook.write_text("https://chat.example/hooks/alice-token\n")
    (tmp_path / "dm").write_text("https://deadman.example/ping")
    config = alertmanager_config(None, settings.monitoring.oncall, today=date(2026, 1, 14))
    receivers = {r["name"]: r for r in config["receivers"]}
    assert receivers["first-line-alice"]["webhook_configs"][0]["url"] == "https://chat.example/hooks/alice-token"
    assert receivers["deadman"]["webhook_configs"][0]["url"] == "https://deadman.example/ping"
    hook.write_text("https://chat.example/hooks/alice-new-token")  # rotated in the Secret: the next config has it
    config = alertmanager_config(None, settings.monitoring.oncall, today=date(2026, 1, 14))
    assert "alice-new-token" in yaml.safe_dump(config)
    hook.unlink()
    with pytest.raises(SecretFileError, match=r"on-call contact alice: cannot read webhook_url_file .*: on Kubernetes"):
        alertmanager_config(None, settings.monitoring.oncall)


def routes_by_receiver(config: dict[str, object]) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}

    def walk(route: dict[str, object], severity: str) -> None:
        for child in route.get("routes", []):  # type: ignore[attr-defined]
            matchers = child.get("matchers", [])
            matched = matchers[0] if matchers else severity
            walk(child, matched)
            found[f"{matched} -> {child['receiver']}"] = child

    walk(config["route"], "")  # type: ignore[arg-type]
    return found


def test_critical_pages_the_first_line_after_its_causes_wait_then_escalates_warnings_wait_for_business_hours() -> None:
    oncall = OnCall(
        rotation=(ALICE, BOB),
        second_line=CAROL,
        owner=DAVE,
        escalate_after="10m",
        owner_after="30m",
        smtp_smarthost="mail:25",
        smtp_from="alerts@example.org",
        deadman_url="http://deadman/ping",
    )
    config = alertmanager_config(None, oncall, today=date(2026, 1, 14))
    routes = routes_by_receiver(config)
    critical, warning = 'severity="critical"', 'severity="warning"'
    assert set(routes) == {
        'alertname="Watchdog" -> deadman',
        f"{critical} -> default",
        f"{critical} -> first-line-alice",
        f"{critical} -> first-line-bob",
        f"{critical} -> second-line",
        f"{critical} -> owner",
        f"{warning} -> default",
        f"{warning} -> first-line-alice",
        f"{warning} -> first-line-bob",
        f"{warning} -> second-line",
    }
    # The first page waits 30 s (a cause fired by another rule group still inhibits); the
    # escalation waits count from that first page.
    assert routes[f"{critical} -> default"]["group_wait"] == "30s"
    assert routes[f"{critical} -> second-line"]["group_wait"] == "630s"
    assert routes[f"{critical} -> owner"]["group_wait"] == "1830s"
    assert routes[f"{critical} -> first-line-bob"]["active_time_intervals"] == ["oncall-bob"]
    assert "mute_time_intervals" not in routes[f"{critical} -> first-line-bob"]
    assert routes[f"{warning} -> second-line"]["mute_time_intervals"] == ["after-hours"]
    assert routes[f"{critical} -> owner"]["continue"] is False
    assert config["global"] == {"smtp_smarthost": "mail:25", "smtp_from": "alerts@example.org"}


@pytest.mark.process
@pytest.mark.skipif(not shutil.which("amtool"), reason="amtool is missing: apt-get install prometheus-alertmanager")
@pytest.mark.parametrize("webhook", [None, "http://127.0.0.1:9/all"])
def test_the_oncall_config_passes_amtool(tmp_path: Path, webhook: str | None) -> None:
    (tmp_path / "relay").write_text("relay-pass\n")
    oncall = OnCall(
        rotation=(ALICE, BOB),
        second_line=CAROL,
        owner=DAVE,
        smtp_smarthost="mail:25",
        smtp_from="alerts@example.org",
        smtp_auth_username="alerts",
        smtp_auth_password_file=tmp_path / "relay",
        timezone="Europe/Berlin",
    )
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(alertmanager_config(webhook, oncall, today=date(2026, 12, 20))))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
