"""Zero to JupyterHub's own hub config, unchanged, with gpuslice's overlay: a real hub spawns a GPU server.

The z2jh 4.4.0 chart (../shared/vendor) is rendered with helm/z2jh-values.yaml; its hub
ConfigMap and Secret are laid out as its Deployment mounts them and its own
files/hub/jupyterhub_config.py runs from /usr/local/etc/jupyterhub in a private mount
namespace, with the hub container's env from the rendered Deployment. The API double
enforces the RBAC the two charts grant (z2jh's Role and the companion's ClusterRole, for
z2jh's hub ServiceAccount) and runs only the scheduler configured with gpushare's extender
(default-scheduler): z2jh's user scheduler has none. So this run goes through tornado's curl
client (pycurl), z2jh's dict-valued volumes, list_node under RBAC and the pod's scheduler.

Only test-local settings are added as a third values file, through z2jh's own hub.config
pass-through: addresses on 127.0.0.1 and free ports, the proxy started by the hub.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.e2e.platform import free_port
from tests.kube.conftest import _wait_http, gpushare_node
from tests.kube.z2jh import hub_deployment, hub_env, in_hub_paths, lay_out, rbac_objects, render_companion, render_z2jh

REPO = Path(__file__).parents[2]
NAMESPACE = "jhub"
HUB_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:hub"


def local_values(root: Path, ports: dict[str, int], admin_token: str) -> Path:
    values = {
        "hub": {
            "config": {
                "JupyterHub": {
                    "bind_url": f"http://127.0.0.1:{ports['public']}",
                    "hub_bind_url": f"http://127.0.0.1:{ports['hub']}",
                    "hub_connect_url": f"http://127.0.0.1:{ports['hub']}",
                    "pid_file": str(root / "jupyterhub.pid"),
                },
                "ConfigurableHTTPProxy": {
                    "should_start": True,
                    "api_url": f"http://127.0.0.1:{ports['proxy_api']}",
                    "command": [str(REPO / "node_modules" / ".bin" / "configurable-http-proxy")],
                    "pid_file": str(root / "proxy.pid"),
                },
                # The GPU line's file in the scratch folder, not the overlay's /srv/jupyterhub (z2jh's volume).
                "KubeGpuSpawner": {
                    "gpu_inventory_ttl": 1,
                    "http_timeout": 60,
                    "gpu_ledger_path": str(root / "ledger.sqlite"),
                },
            },
            "services": {"test-admin": {"apiToken": admin_token}},
            "loadRoles": {
                "test-admin": {"services": ["test-admin"], "scopes": ["admin:users", "admin:servers", "access:servers"]}
            },
        },
        "singleuser": {"startTimeout": 60, "extraEnv": {"GPUSLICE_DOUBLE_ROOT": str(root / "pods")}},
        "custom": {"gpuslice": {"gpuIdleTimeout": 300}},  # the reclaimer's timeout, read by the overlay
    }
    path = root / "local.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def rbac_file(root: Path, objects: list[dict[str, Any]], hub_token: str, admin_token: str) -> Path:
    """The charts' RBAC, and a cluster admin for the test's own reads."""
    admin = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "test-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "test-admin"},
            "subjects": [{"kind": "User", "name": "test-admin"}],
            "roleRef": {"kind": "ClusterRole", "name": "test-admin"},
        },
    ]
    path = root / "rbac.json"
    tokens = {hub_token: HUB_ACCOUNT, admin_token: "test-admin"}
    path.write_text(json.dumps({"tokens": tokens, "objects": [*objects, *admin]}))
    return path


def test_z2jhs_own_config_spawns_a_gpu_server_through_kube_gpu_spawner(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("public", "hub", "proxy_api", "api")}
    admin_token, hub_token = secrets.token_hex(16), secrets.token_hex(16)
    z2jh = render_z2jh(local_values(tmp_path, ports, admin_token))
    assert hub_deployment(z2jh)["spec"]["template"]["spec"]["serviceAccountName"] == "hub"
    etc = tmp_path / "etc"
    lay_out(z2jh, etc)

    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([gpushare_node("gpu-a", 1, 15)]))
    rbac = rbac_file(tmp_path, rbac_objects(z2jh, render_companion()), hub_token, admin_token)
    api_log = (tmp_path / "apiserver.log").open("wb")
    api_command = ["--port", str(ports["api"]), "--nodes", str(nodes), "--rbac", str(rbac)]
    apiserver = subprocess.Popen(
        [sys.executable, "-m", "tests.kube.apiserver", *api_command, "--schedulers", "default-scheduler"],
        stdout=api_log,
        stderr=api_log,
        cwd=REPO,
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": f"http://127.0.0.1:{ports['api']}"}}],
                "users": [{"name": "hub", "user": {"token": hub_token}}],  # z2jh's hub ServiceAccount
                "contexts": [{"name": "double", "context": {"cluster": "double", "user": "hub"}}],
                "current-context": "double",
            }
        )
    )
    # The rendered container's env, plus the Services' env the kubelet adds and what the test needs.
    env = {
        **hub_env(z2jh, NAMESPACE),
        "HUB_SERVICE_PORT": str(ports["hub"]),
        "PROXY_API_SERVICE_PORT": str(ports["proxy_api"]),
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
    }
    args = hub_deployment(z2jh)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["jupyterhub", "--config", "/usr/local/etc/jupyterhub/jupyterhub_config.py"]
    assert "--upgrade-db" in args
    hub_log = (tmp_path / "hub.log").open("wb")
    hub = subprocess.Popen(
        in_hub_paths(etc, [sys.executable, "-m", *args]), env=env, cwd=tmp_path, stdout=hub_log, stderr=hub_log
    )
    public = f"http://127.0.0.1:{ports['public']}"
    admin = {"Authorization": f"token {admin_token}"}
    try:
        _wait_http(f"http://127.0.0.1:{ports['api']}/version", apiserver, tmp_path / "apiserver.log")
        _wait_http(f"{public}/hub/health", hub, tmp_path / "hub.log", timeout_s=90)
        log = (tmp_path / "hub.log").read_text()
        assert "Loading pass-through config section hub.config.KubeGpuSpawner" in log
        # The overlay's extraConfig adds the GPU line's hub side: the reclaimer runs, and the
        # warnings' page is there and asks who is looking (a login redirect, not a 404).
        assert "Loading extra config: gpuslice" in log
        assert logged(tmp_path / "hub.log", "Starting service 'gpu-reclaimer'"), "the gpu-reclaimer did not start"
        assert "--gpu-idle-timeout=300" in (tmp_path / "hub.log").read_text()  # custom.gpuslice.gpuIdleTimeout
        anonymous = requests.get(f"{public}/hub/gpuslice/notice", allow_redirects=False, timeout=30)
        assert anonymous.status_code == 302 and "/hub/login" in anonymous.headers["Location"], anonymous.status_code

        assert requests.post(f"{public}/hub/api/users/gina", headers=admin, timeout=30).status_code == 201
        started = requests.post(
            f"{public}/hub/api/users/gina/server", headers=admin, json={"gpu_memory": "4GiB"}, timeout=60
        )
        assert started.status_code in (201, 202), started.text
        wait_ready(public, admin, "gina", tmp_path)

        pod = requests.get(
            f"http://127.0.0.1:{ports['api']}/api/v1/namespaces/{NAMESPACE}/pods/jupyter-gina",
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=10,
        ).json()
        spec = pod["spec"]
        assert spec["schedulerName"] == "default-scheduler"  # the one with gpushare's extender
        assert spec["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
        assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "0"  # placed by the extender
        assert {"name": "volume-gina", "persistentVolumeClaim": {"claimName": "claim-gina"}} in spec["volumes"]
        assert spec["containers"][0]["image"] == "ghcr.io/gpuslice/notebook-base:1.0"
        assert [c["name"] for c in spec.get("initContainers") or []] == ["block-cloud-metadata"]  # gpushare: kept
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "jhub"  # z2jh's common labels
    finally:
        for proc in (hub, apiserver):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def logged(path: Path, text: str, timeout_s: float = 30) -> bool:
    """Whether text appears in the log at path within timeout_s (the hub starts its services as it starts)."""
    import time

    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_ready(public: str, headers: dict[str, str], user: str, root: Path, timeout_s: float = 90) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server = requests.get(f"{public}/hub/api/users/{user}", headers=headers, timeout=30).json()["servers"].get("")
        if server and server.get("ready"):
            return
        if not server or not server.get("pending"):
            raise AssertionError(f"{user}'s server stopped while starting: {server}; see {root}/hub.log")
        time.sleep(0.5)
    raise AssertionError(f"{user}'s server not ready in {timeout_s}s; see {root}/hub.log")
