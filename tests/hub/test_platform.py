from pathlib import Path

import pytest

from hub import monitoring, platform
from hub.settings import from_mapping


def settings(tmp_path: Path, **extra: object) -> object:
    return from_mapping({"data_dir": str(tmp_path / "data"), **extra}, "test")


def test_monitoring_off_says_why_and_still_serves_gpu_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(monitoring, "binaries", lambda: dict.fromkeys(monitoring.BINARIES))
    s = settings(tmp_path)
    (tmp_path / "data").mkdir()
    children = platform.monitoring_children(s, tmp_path / "data", {})  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "monitoring is off: prometheus and alertmanager not installed" in out
    assert "apt-get install prometheus prometheus-alertmanager" in out
    assert [c.name for c in children] == ["exporter"] and children[0].command[3] == "exporter"


def test_monitoring_disabled_in_settings_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = settings(tmp_path, monitoring={"enabled": False})
    assert platform.monitoring_children(s, tmp_path, {}) == []  # type: ignore[arg-type]
    assert "monitoring is off (monitoring.enabled is false" in capsys.readouterr().out


def test_the_hub_token_is_private_and_stable(tmp_path: Path) -> None:
    first = platform.hub_token(tmp_path)
    assert first.stat().st_mode & 0o777 == 0o600
    assert platform.hub_token(tmp_path).read_text() == first.read_text() != ""


def test_up_without_the_proxy_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "PROXY", tmp_path / "missing")
    with pytest.raises(platform.PlatformError, match="run scripts/setup"):
        platform.prepare(settings(tmp_path), None)  # type: ignore[arg-type]


def test_node_exporter_asks_for_the_monitoring_password_and_prometheus_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    monkeypatch.setattr(
        monitoring, "binaries", lambda: {name: f"/usr/bin/{b}" for name, b in monitoring.BINARIES.items()}
    )
    data = tmp_path / "data"
    data.mkdir()
    children = {c.name: c for c in platform.monitoring_children(settings(tmp_path), data, {})}  # type: ignore[arg-type]
    web_config = data / "monitoring" / "web.yml"
    assert f"--web.config.file={web_config}" in children["node_exporter"].command
    assert "basic_auth_users" in yaml.safe_load(web_config.read_text())  # the same file Prometheus reads
    scrapes = yaml.safe_load((data / "monitoring" / "prometheus.yml").read_text())["scrape_configs"]
    node = next(job for job in scrapes if job["job_name"] == "node")
    assert node["basic_auth"]["password_file"] == str(data / "monitoring" / "web-password")
