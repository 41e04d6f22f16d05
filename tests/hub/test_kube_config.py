"""hub/kube_config.py (the chart's hub configuration) loaded as JupyterHub loads it."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from jupyterhub.objects import Hub
from traitlets import import_item
from traitlets.config import Config, PyFileConfigLoader

from spawner.images import SpawnImage
from spawner.quotas import GroupRules

REPO = Path(__file__).parents[2]
ADMIN_PASSWORD = "correct horse battery staple"


def test_the_chart_values_become_hub_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "backend": "hami",
        "policy": "fgd",
        "gpushareMemoryUnit": "MiB",
        "adminUsers": ["teacher"],
        "groups": {"ml101": {"members": ["alice"], "maxSlice": "4GiB", "serversPerUser": 1, "profiles": ["t4"]}},
        "idleTimeout": 1800,
        "gpuIdleTimeout": 600,
        "singleuser": {"cpuGuarantee": 0.5, "memoryGuarantee": "1G", "memoryLimit": "8G", "startTimeout": 300},
        "notebookImage": "ghcr.io/gpuslice/notebook-base:1.0",
        "proxyApiUrl": "http://gs-proxy-api:8001",
        "portalUrl": "http://gs-portal:8502",
        "portalEnabled": True,
        "modelsClaim": "gpuslice-models",
    }
    values["dataDir"] = str(tmp_path)
    config = load_kube_config(values, monkeypatch, tmp_path)
    spawner = config.KubeGpuSpawner
    assert config.JupyterHub.spawner_class == "spawner.kube.KubeGpuSpawner"
    assert (spawner.gpu_backend, spawner.gpu_policy, spawner.namespace) == ("hami", "fgd", "jupyter")
    assert spawner.gpushare_memory_unit == "MiB"
    assert spawner.gpu_backend_settings == {}  # hami: no settings in the values
    assert spawner.gpu_groups == [
        GroupRules(name="ml101", members=("alice",), max_slice="4GiB", servers_per_user=1, profiles=("t4",))
    ]
    assert spawner.gpu_profile_groups == {"t4": ["ml101"]}
    assert spawner.gpu_models_volume == {"persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": True}}
    assert config.JupyterHub.cleanup_servers is False  # a hub restart must not stop notebooks
    assert config.ConfigurableHTTPProxy.should_start is False
    services = {s["name"]: s for s in config.JupyterHub.services}
    assert services["portal"]["url"] == "http://gs-portal:8502" and services["portal"]["api_token"] == "p"
    assert config.Authenticator.admin_users == {"teacher"}
    # The GPU line's reclaimer and the line's estimated starts use the chart's gpuIdleTimeout.
    assert spawner.gpu_idle_timeout == 600
    assert "--gpu-idle-timeout=600" in services["gpu-reclaimer"]["command"]
    # Activity is what the servers report, not the proxy's traffic (an open page's polls).
    assert config.JupyterHub.last_activity_interval == 0


def load_kube_config(values: dict[str, object], monkeypatch: pytest.MonkeyPatch, folder: Path) -> Config:
    """hub/kube_config.py as the hub container loads it, with ``values`` as the chart's ConfigMap."""
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    for name, value in {
        "GPUSLICE_KUBE_VALUES": str(path),
        "GPUSLICE_HUB_URL": "http://gs-hub:8081",
        "GPUSLICE_METRICS_TOKEN": "m",
        "GPUSLICE_PORTAL_TOKEN": "p",
        "POD_NAMESPACE": "jupyter",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUSLICE_MARKET_URL", raising=False)
    password = folder / "admin-password"
    password.write_text(ADMIN_PASSWORD)
    monkeypatch.setenv("GPUSLICE_ADMIN_PASSWORD_FILE", str(password))
    return PyFileConfigLoader("kube_config.py", path=str(REPO / "hub")).load_config()


def test_the_chart_values_give_the_kai_backend_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "backend": "kai",
        "backendSettings": {"defaultQueue": "lab", "queues": {"ml101": "teaching"}, "createQueues": True},
        "notebookImage": "nb",
        "proxyApiUrl": "http://gs-proxy-api:8001",
        "dataDir": str(tmp_path),
    }
    spawner = load_kube_config(values, monkeypatch, tmp_path).KubeGpuSpawner
    # The chart's own keys (createQueues) stay out; the backend's are its fields' names.
    assert spawner.gpu_backend_settings == {"default_queue": "lab", "queues": {"ml101": "teaching"}}


def test_a_fresh_install_migrates_the_market_so_the_first_spawn_lists_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spawner.kube import KubeGpuSpawner

    values = {
        "backend": "gpushare",
        "policy": "default",
        "notebookImage": "ghcr.io/gpuslice/notebook-base:1.0",
        "proxyApiUrl": "http://gs-proxy-api:8001",
        "dataDir": str(tmp_path),  # an empty PVC: no market database yet
    }
    config = load_kube_config(values, monkeypatch, tmp_path)
    assert config.KubeGpuSpawner.gpu_market_url == f"sqlite:///{tmp_path / 'market.sqlite'}"

    async def first_spawns_images() -> dict[str, SpawnImage]:  # KubeSpawner is built in a running loop
        spawner = KubeGpuSpawner(config=config, hub=Hub(), api_token="t", _mock=True)
        return spawner.images()  # what every spawn asks first; it failed on a database without tables

    images = asyncio.run(first_spawns_images())
    assert images["default"].target == "ghcr.io/gpuslice/notebook-base:1.0"


def test_a_stranger_cannot_claim_a_chart_class_member_who_joins_with_an_invite_made_in_the_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hub.accounts import redeem_invite
    from hub.cli import main

    values = {
        "adminUsers": ["teacher"],
        "groups": {"ml101": {"members": ["Alice", "bob"], "teachers": ["tina"], "maxSlice": "4GiB"}},
        "openSignup": True,
        "notebookImage": "ghcr.io/gpuslice/notebook-base:1.0",
        "proxyApiUrl": "http://gs-proxy-api:8001",
        "dataDir": str(tmp_path / "pvc"),
    }
    config = load_kube_config(values, monkeypatch, tmp_path)  # sets $GPUSLICE_KUBE_VALUES, as the chart does
    authenticator = import_item(config.JupyterHub.authenticator_class)(config=config)

    for name in ("alice", "tina"):  # a member, and a teacher who is in no group's members
        assert "cannot be claimed" in refusal(authenticator, name, "mallory-was-here")
    assert log_in(authenticator, "mallory", "mallorys-own") == "mallory"  # open sign-up: names nobody knows

    # kubectl exec deploy/gs-gpuslice-hub -- gpuslice user invite: the pod's environment names the values
    assert main(["user", "invite"]) == 0
    codes = dict(line.split(",") for line in capsys.readouterr().out.splitlines() if "," in line and " " not in line)
    assert set(codes) == {"alice", "bob", "tina"}
    assert "/hub/join" in refusal(authenticator, "alice", codes["alice"])  # a code is never a password
    redeem_invite(Path(authenticator.data_dir), "alice", codes["alice"], "alices-own-pw")  # what /hub/join does
    assert log_in(authenticator, "alice", "alices-own-pw") == "alice"
    assert log_in(authenticator, "alice", "mallory-was-here") is None

    assert main(["user", "set-password", "bob"]) == 0  # an admin's reset, also in the pod
    password = capsys.readouterr().out.rsplit(": ", 1)[1].strip()
    assert log_in(authenticator, "bob", password) == "bob"


def login_page() -> SimpleNamespace:
    """What the authenticator reads of JupyterHub's login handler: the hub's URL, the request's addresses."""
    request = SimpleNamespace(
        headers={"X-Forwarded-For": "10.0.0.1"},
        remote_ip="10.0.0.1",
        connection=SimpleNamespace(context=SimpleNamespace(address=("10.0.0.1", 50000))),
    )
    return SimpleNamespace(custom_login_error="", hub=SimpleNamespace(base_url="/hub/"), request=request)


def log_in(authenticator: Any, user: str, password: str) -> str | None:
    result: str | None = asyncio.run(authenticator.authenticate(login_page(), {"username": user, "password": password}))
    return result


def refusal(authenticator: Any, user: str, password: str) -> str:
    """The message of a refused login (FirstUseAuthenticator's login page shows it)."""
    handler = login_page()
    assert asyncio.run(authenticator.authenticate(handler, {"username": user, "password": password})) is None
    return str(handler.custom_login_error)
