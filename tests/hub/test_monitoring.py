"""Rules and configs checked by the real tools (Debian's prometheus and alertmanager packages)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hub.monitoring import RULE_FILES, Ports, alertmanager_config, prometheus_config

HERE = Path(__file__).parent


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: scripts/setup installs it (apt-get install prometheus prometheus-alertmanager)"
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=HERE / "monitoring", timeout=120)


@pytest.mark.process
def test_rule_files_pass_promtool_check() -> None:
    result = run(tool("promtool"), "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


# The minute-by-minute cases, and the days-long ones evaluated every 5 minutes (a week at 1m cost two minutes).
ALERT_TESTS = ("alerts_test.yml", "alerts_week_test.yml")


@pytest.mark.process
@pytest.mark.parametrize("tests_file", ALERT_TESTS)
def test_the_alerts_unit_tests_pass(tests_file: str) -> None:
    result = run(tool("promtool"), "test", "rules", tests_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULE_FILES[1].read_text())["groups"] for r in g["rules"]}
    tested = {
        case["alertname"]
        for name in ALERT_TESTS
        for test in yaml.safe_load((HERE / "monitoring" / name).read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts without a firing test: {alerts - tested}"


def test_every_alert_has_severity_for_and_a_runbook_section() -> None:
    runbook = (HERE.parents[1] / "docs" / "runbook.md").read_text()
    sections = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for group in yaml.safe_load(RULE_FILES[1].read_text())["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "Watchdog":  # the heartbeat: fires at once and pages nobody by design
                assert rule["labels"]["severity"] == "none" and "for" not in rule
            else:
                assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
                assert rule.get("for"), rule["alert"]
            assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
            anchor = rule["annotations"]["runbook"].partition("#")[2]
            assert anchor in sections, f"docs/runbook.md has no section for {rule['alert']} (#{anchor})"


@pytest.mark.process
@pytest.mark.parametrize("node_exporter", [True, False])
def test_generated_prometheus_config_passes_promtool(tmp_path: Path, node_exporter: bool) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    config = prometheus_config(Ports(8081, 9400, 9090, 9093, 9100), token, node_exporter=node_exporter)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = run(tool("promtool"), "check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = [j["job_name"] for j in config["scrape_configs"]]
    assert jobs == ["jupyterhub", "gpu-exporter", "prometheus", "alertmanager", *(["node"] if node_exporter else [])]
    assert "secret" not in path.read_text()  # the token stays in its own file


@pytest.mark.process
@pytest.mark.parametrize("webhook", ["http://127.0.0.1:9999/alerts", None])
def test_generated_alertmanager_config_passes_amtool(tmp_path: Path, webhook: str | None) -> None:
    path = tmp_path / "alertmanager.yml"
    config = alertmanager_config(webhook)
    path.write_text(yaml.safe_dump(config))
    result = run(tool("amtool"), "check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    routes = {r["matchers"][0]: r["receiver"] for r in config["route"]["routes"]}
    assert routes == {
        'alertname="Watchdog"': "deadman",
        'severity="critical"': "critical",
        'severity="warning"': "warning",
    }
    deadman = next(r for r in config["receivers"] if r["name"] == "deadman")
    assert deadman == {"name": "deadman"}  # without a dead man's switch, the heartbeat goes nowhere


def test_the_chart_renders_the_same_rule_files() -> None:
    chart_files = HERE.parents[1] / "helm" / "gpuslice" / "files"
    for rules in RULE_FILES:
        assert (chart_files / rules.name).read_text() == rules.read_text(), f"copy {rules} to {chart_files}"
