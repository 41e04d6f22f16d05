"""Accounts on Kubernetes survive restarts and cannot be claimed: the rendered chart, then the hub's config."""

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from firstuseauthenticator import FirstUseAuthenticator

from hub.authenticator import GpusliceAuthenticator
from tests.helm.test_chart import render
from tests.hub.test_kube_config import load_kube_config, login_page

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

EXTERNAL_DB = {"hub": {"db": {"existingSecret": "hub-db"}}, "adminUsers": ["teacher"]}


def rendered(folder: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    given = folder / "given.yaml"
    given.write_text(yaml.safe_dump(values))
    return render(given)


def hub_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gs-gpuslice-hub")
    return dict(deployment["spec"]["template"]["spec"])


def mounted_volume(pod: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container's mount holding ``path`` and its volume."""
    mounts = pod["containers"][0]["volumeMounts"]
    mount = max((m for m in mounts if path.startswith(m["mountPath"] + "/")), key=lambda m: len(m["mountPath"]))
    return mount, next(v for v in pod["volumes"] if v["name"] == mount["name"])


def test_with_an_external_database_the_password_store_is_on_the_claim(tmp_path: Path) -> None:
    docs = rendered(tmp_path, EXTERNAL_DB)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gs-gpuslice-hub")
    data_dir = yaml.safe_load(config["data"]["values.yaml"])["dataDir"]
    _, volume = mounted_volume(hub_pod(docs), f"{data_dir}/passwords.dbm")
    assert "emptyDir" not in volume  # an emptyDir lost every password at each restart
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs)


def login(authenticator: FirstUseAuthenticator, user: str, password: str) -> str | None:
    handler = login_page()  # what the authenticator reads of JupyterHub's login handler
    return asyncio.run(authenticator.authenticate(handler, {"username": user, "password": password}))


def test_admins_log_in_with_the_secrets_password_and_nobody_claims_their_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered(tmp_path, {"adminUsers": ["teacher"]})
    pod = hub_pod(docs)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mount, volume = mounted_volume(pod, env["GPUSLICE_ADMIN_PASSWORD_FILE"])
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == volume["secret"]["secretName"])
    item = next(
        i
        for i in volume["secret"]["items"]
        if f"{mount['mountPath']}/{i['path']}" == env["GPUSLICE_ADMIN_PASSWORD_FILE"]
    )
    password = base64.b64decode(secret["data"][item["key"]]).decode()
    assert len(password) >= 12

    values = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["values.yaml"])
    values["dataDir"] = str(tmp_path)
    (tmp_path / "secret").mkdir()
    monkeypatch.setattr("tests.hub.test_kube_config.ADMIN_PASSWORD", password)
    config = load_kube_config(values, monkeypatch, tmp_path / "secret")
    assert Path(config.GpusliceAuthenticator.dbm_path).parent == tmp_path
    authenticator = GpusliceAuthenticator(config=config)
    assert login(authenticator, "teacher", "mine-now-123") is None  # the first login does not set it
    assert login(authenticator, "teacher", password) == "teacher"
    assert login(authenticator, "alice", "alices-own-pw") == "alice"  # open signup: a new name sets its own

    load_kube_config(values, monkeypatch, tmp_path / "secret")  # the hub restarts on the same volume
    authenticator = GpusliceAuthenticator(config=config)
    assert login(authenticator, "teacher", password) == "teacher"
    assert login(authenticator, "alice", "someone-else") is None and login(authenticator, "alice", "alices-own-pw")


def test_an_existing_secret_names_the_admin_password(tmp_path: Path) -> None:
    pod = hub_pod(rendered(tmp_path, {"hub": {"adminSecret": "gpuslice-admin"}}))
    _, volume = mounted_volume(pod, "/etc/gpuslice-admin/password")
    assert volume["secret"] == {"secretName": "gpuslice-admin", "items": [{"key": "password", "path": "password"}]}


def test_the_hubs_sqlite_databases_are_absolute_paths_on_its_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.kube_values import load_kube_values
    from spawner import environ

    docs = rendered(tmp_path, {})
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gs-gpuslice-hub")
    (tmp_path / "values.yaml").write_text(config["data"]["values.yaml"])
    values = load_kube_values(tmp_path / "values.yaml")
    no_secrets = environ.read({})  # neither database URL given: SQLite on the hub's claim
    for url in (values.db_url(no_secrets), values.market_url(no_secrets)):
        path = url.removeprefix("sqlite:///")
        assert path.startswith("/"), url  # not relative to the image's working folder
        _, volume = mounted_volume(hub_pod(docs), path)
        assert "persistentVolumeClaim" in volume, url
