"""hub/wiring.py: the three hubs' configs are wired by one function (literal configs, no hub started)."""

from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config, PyFileConfigLoader

from hub import roles
from hub.settings import SettingsError, from_mapping
from hub.wiring import Accounts, HubParts, configure_hub, configure_z2jh_hub
from spawner.quotas import GroupRules
from spawner.start_turns import default_limit

REPO = Path(__file__).parents[2]
SETTINGS = from_mapping(
    {"admin_users": ["teacher"], "groups": {"ml101": {"members": ["ann"], "max_slice": "4GiB"}}, "idle_timeout": 1800},
    "s.yaml",
)
LOCAL = HubParts(
    spawner="LocalGpuSpawner",
    ledger_path="/data/ledger.sqlite",
    run_module=("python", "-m", "hub.with_hub", "--hub-pid=1"),
    accounts=Accounts(Path("/data"), frozenset({"teacher", "ann"})),
    portal={"url": "http://127.0.0.1:8502", "api_token": "t"},
)


def services(c: Config) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in c.JupyterHub.services}


def test_one_wiring_gives_every_service_its_role_and_the_spawner_its_rules() -> None:
    c = Config()
    configure_hub(c, SETTINGS, LOCAL)
    found = services(c)
    assert set(found) == {"idle-culler", "gpu-reclaimer", "portal"}
    assert found["idle-culler"]["command"][-2:] == ["jupyterhub_idle_culler", "--timeout=1800"]
    assert found["gpu-reclaimer"]["command"][:5] == ["python", "-m", "hub.with_hub", "--hub-pid=1", "hub.reclaimer"]
    assert "--gpu-idle-timeout=900" in found["gpu-reclaimer"]["command"]
    assert found["portal"]["oauth_client_allowed_scopes"] == roles.PORTAL_OAUTH_SCOPES
    assert {r["name"] for r in c.JupyterHub.load_roles} == {"idle-culler", "gpu-reclaimer", "portal", "user"}
    assert c.LocalGpuSpawner.gpu_groups == [GroupRules(name="ml101", members=("ann",), max_slice="4GiB")]
    assert (c.LocalGpuSpawner.gpu_idle_timeout, c.LocalGpuSpawner.gpu_culler_timeout) == (900, 1800)
    # A class: sign-up closed by default, only the known names may log in.
    assert c.GpusliceAuthenticator.create_users is False
    assert c.Authenticator.allowed_users == {"teacher", "ann"}
    assert c.JupyterHub.load_groups == {"ml101": {"users": ["ann"]}}
    assert c.JupyterHub.last_activity_interval == 0
    assert c.GpusliceAuthenticator.trusted_proxies == ["127.0.0.0/8", "::1/128"]  # a reverse proxy on this machine
    configure_hub(c, SETTINGS, LOCAL)  # wiring twice doubles nothing
    assert len(c.JupyterHub.services) == 3 and len(c.JupyterHub.load_roles) == 4


def test_the_single_machine_config_goes_through_the_one_wiring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = tmp_path / "s.yaml"
    settings.write_text("groups: {ml101: {members: [ann], max_slice: 4GiB}}\nidle_timeout: 1800\n")
    monkeypatch.setenv("GPUSLICE_SETTINGS", str(settings))
    monkeypatch.setenv("GPUSLICE_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    monkeypatch.setattr("hub.metrics.register_allocations", lambda collector: None)  # a process-wide registry
    c = PyFileConfigLoader("jupyterhub_config.py", path=str(REPO / "hub")).load_config()
    found = services(c)
    # renewals: the single machine renews its Alertmanager config and notices itself (hub/renewals.py);
    # no incident-recorder here: gpuslice up did not start monitoring, so it made no webhook token.
    assert set(found) == {
        *("idle-culler", "gpu-reclaimer", "portal", "renewals", "gpuslice-top", "gpuslice-cli", "job-dispatcher"),
        "gpu-patrol",
    }
    assert f"--ledger={tmp_path / 'data' / 'ledger.sqlite'}" in found["gpu-reclaimer"]["command"]
    # Jobs: the dispatcher with the same ledger and classes, the jobs API, and servers' tokens that may submit.
    dispatcher = found["job-dispatcher"]["command"]
    assert f"--ledger={tmp_path / 'data' / 'ledger.sqlite'}" in dispatcher
    assert (
        f"--classes={tmp_path / 'data' / 'classes.sqlite'}" in dispatcher
        and f"--data-dir={tmp_path / 'data'}" in dispatcher
    )
    assert any(pattern == r"/api/gpuslice/jobs" for pattern, _ in c.JupyterHub.extra_handlers)
    assert "servers!user" in c.LocalGpuSpawner.server_token_scopes
    assert c.LocalGpuSpawner.gpu_classes_path == str(tmp_path / "data" / "classes.sqlite")
    assert c.JupyterHub.extra_handlers and str(REPO / "hub" / "templates") in c.JupyterHub.template_paths
    assert c.LocalGpuSpawner.gpu_groups[0].name == "ml101" and c.GpusliceAuthenticator.create_users is False
    assert c.LocalGpuSpawner.gpu_concurrent_starts == default_limit()  # the settings left it empty
    settings.write_text("concurrent_starts: 0\n")
    assert (
        PyFileConfigLoader("jupyterhub_config.py", path=str(REPO / "hub"))
        .load_config()
        .LocalGpuSpawner["gpu_concurrent_starts"]
        == 0
    )


def test_with_monitoring_the_single_machine_runs_the_incident_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = tmp_path / "s.yaml"
    settings.write_text("monitoring: {recorder_port: 19095, alertmanager_port: 19093}\n")
    monkeypatch.setenv("GPUSLICE_SETTINGS", str(settings))
    monkeypatch.setenv("GPUSLICE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GPUSLICE_MONITORING_PASSWORD_FILE", str(tmp_path / "data" / "monitoring" / "web-password"))
    (tmp_path / "data" / "monitoring").mkdir(parents=True)
    (tmp_path / "data" / "monitoring" / "recorder-token").write_text("t")  # what gpuslice up makes
    monkeypatch.setattr("hub.metrics.register_allocations", lambda collector: None)
    c = PyFileConfigLoader("jupyterhub_config.py", path=str(REPO / "hub")).load_config()
    recorder = services(c)["incident-recorder"]["command"]
    assert recorder[recorder.index("portal.recorder") :] == [
        "portal.recorder",
        f"--data-dir={tmp_path / 'data'}",
        "--port=19095",
        f"--token-file={tmp_path / 'data' / 'monitoring' / 'recorder-token'}",
        "--alertmanager-url=http://127.0.0.1:19093",
        "--prometheus-url=http://127.0.0.1:9090",
        f"--password-file={tmp_path / 'data' / 'monitoring' / 'web-password'}",
    ]
    assert {"name": "incident-recorder", "scopes": [], "services": ["incident-recorder"]} in c.JupyterHub.load_roles


def z2jh_config(values: dict[str, Any]) -> Any:
    """z2jh's ``get_config``: a dotted key into the release's values."""

    def get_config(key: str, default: Any = None) -> Any:
        node: Any = values
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    return get_config


def z2jh_hub(volume: Path) -> Config:
    """What z2jh's own jupyterhub_config.py has set when the extraConfig runs (its volume: ``volume``)."""
    c = Config()
    c.KubeGpuSpawner.gpu_groups = [{"name": "ml101", "max_slice": "4GiB", "budget": "40GiB"}]
    c.KubeGpuSpawner.gpu_ledger_path = str(volume / "gpuslice-ledger.sqlite")
    c.JupyterHub.services = [
        {"name": "jupyterhub-idle-culler", "command": ["python3", "-m", "jupyterhub_idle_culler"]},
        {"name": "portal", "url": "http://gpuslice-portal:8502", "api_token": "z2jh-made"},
    ]
    c.JupyterHub.load_roles = [{"name": "jupyterhub-idle-culler", "scopes": ["list:users"]}]
    return c


def test_z2jh_keeps_its_culler_and_tokens_and_gets_the_same_wiring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "jhub")
    c = z2jh_hub(tmp_path)
    values = {
        "cull": {"enabled": True, "timeout": 3600},
        "custom": {"gpuslice": {"gpuIdleTimeout": 300}},
        "hub": {"services": {"portal": {"url": "http://gpuslice-portal:8502"}}},
    }
    configure_z2jh_hub(c, z2jh_config(values))
    found = services(c)
    # z2jh's culler, not a second; `gpuslice class` in the hub's pod changes the classes live
    assert set(found) == {"jupyterhub-idle-culler", "portal", "gpu-reclaimer", "gpuslice-cli"}
    assert found["portal"]["api_token"] == "z2jh-made"  # z2jh's token kept, our scopes added
    assert found["portal"]["oauth_client_allowed_scopes"] == roles.PORTAL_OAUTH_SCOPES
    assert "--kube-namespace=jhub" in found["gpu-reclaimer"]["command"]
    assert "--gpu-idle-timeout=300" in found["gpu-reclaimer"]["command"]
    assert {"portal", "user", "gpu-reclaimer"} <= {r["name"] for r in c.JupyterHub.load_roles}
    assert c.KubeGpuSpawner.gpu_culler_timeout == 3600  # z2jh's culler's stops are named
    assert c.KubeGpuSpawner.gpu_groups[0].budget == "40GiB"
    assert "authenticator_class" not in c.JupyterHub  # z2jh's own logins


def test_z2jh_refuses_a_reclaimer_its_culler_would_beat(tmp_path: Path) -> None:
    """The rule the chart checked alone now holds for z2jh's cull.timeout too."""
    values = {"cull": {"enabled": True, "timeout": 600}, "custom": {"gpuslice": {"gpuIdleTimeout": 900}}}
    with pytest.raises(SettingsError, match=r"gpuIdleTimeout \(900 s\) must be below cull.timeout \(600 s\)"):
        configure_z2jh_hub(z2jh_hub(tmp_path), z2jh_config(values))
    bad_rules = z2jh_hub(tmp_path)
    bad_rules.KubeGpuSpawner.gpu_groups = [{"name": "ml101", "max_slise": "4GiB"}]
    with pytest.raises(SettingsError, match=r"max_slise \(did you mean max_slice\?\)"):
        configure_z2jh_hub(bad_rules, z2jh_config({}))


def test_z2jh_refuses_custom_keys_that_are_z2jhs_own(tmp_path: Path) -> None:
    """Sign-up and admins are z2jh's authenticator's, the culler's timeout cull.timeout: not custom.gpuslice's."""
    values = {"custom": {"gpuslice": {"openSignup": False, "gpuIdleTimout": 300}}}
    with pytest.raises(
        SettingsError, match=r"unknown key\(s\) gpuIdleTimout \(did you mean gpuIdleTimeout\?\), openSignup"
    ):
        configure_z2jh_hub(z2jh_hub(tmp_path), z2jh_config(values))


def test_every_hub_gives_the_reclaimer_each_classs_max_hold_and_keeps_no_activity_from_the_future() -> None:
    from datetime import UTC, datetime, timedelta

    from jupyterhub import orm

    settings = from_mapping(
        {"groups": {"ml101": {"members": ["ann"], "max_hold": "2h"}, "cv202": {"members": ["bo"]}}}, "s.yaml"
    )
    c = Config()
    configure_hub(c, settings, LOCAL)
    assert [a for a in services(c)["gpu-reclaimer"]["command"] if a.startswith("--max-hold")] == [
        "--max-hold=ml101=7200"
    ]
    user = orm.User(name="ann")  # what JupyterHub's activity API does with a stamp 59 minutes ahead
    user.last_activity = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=59)
    assert user.last_activity <= datetime.now(UTC).replace(tzinfo=None)


def test_a_hub_with_a_class_store_takes_its_classes_and_serves_their_api(tmp_path: Path) -> None:
    """The store seeded with the settings' classes; a class made live before this start is a JupyterHub group
    and its people are known names; the classes API and `gpuslice class`'s service are added once."""
    from hub.classes_api import CLASSES_HANDLERS
    from hub.wiring import LiveClasses
    from spawner.class_store import ClassStore

    store = ClassStore(tmp_path / "classes.sqlite")
    store.change("cv202", lambda rules: {"members": ["dee"], "teachers": ["tom"]})  # made live, the hub down
    c = Config()
    live = LiveClasses(store.path, tmp_path, cli_token="cli")
    configure_hub(c, SETTINGS, HubParts(**{**LOCAL.__dict__, "classes": live}))
    assert [g["name"] for g in store.classes()] == ["cv202", "ml101"]  # the settings' class taken in
    assert c.LocalGpuSpawner.gpu_classes_path == str(store.path)
    assert c.JupyterHub.load_groups == {"ml101": {"users": ["ann"]}, "cv202": {"users": ["dee"]}}
    assert {"dee", "tom", "ann", "teacher"} <= c.GpusliceAuthenticator.known_names == c.Authenticator.allowed_users
    assert services(c)["gpuslice-cli"]["api_token"] == "cli"
    assert {"name": "gpuslice-cli", "scopes": list(roles.CHANGES_CLASSES)}.items() <= next(
        r for r in c.JupyterHub.load_roles if r["name"] == "gpuslice-cli"
    ).items()
    assert c.JupyterHub.extra_handlers.count(CLASSES_HANDLERS[0]) == 1
    assert c.JupyterHub.tornado_settings["gpuslice_classes_path"] == str(store.path)
    assert c.JupyterHub.tornado_settings["slow_spawn_timeout"] == 2  # the place in line within seconds of Start
    configure_hub(c, SETTINGS, HubParts(**{**LOCAL.__dict__, "classes": live}))  # twice: nothing doubled
    assert c.JupyterHub.extra_handlers.count(CLASSES_HANDLERS[0]) == 1 and len(c.JupyterHub.services) == 4
