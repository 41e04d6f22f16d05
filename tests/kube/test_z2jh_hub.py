"""Zero to JupyterHub's own hub, in the hub image users run, spawns a GPU server through KubeGpuSpawner.

The z2jh 4.4.0 chart (../shared/vendor) is rendered with helm/z2jh-values.yaml, and its hub
and proxy Deployments run as containers of the images built here (images/hub, the image the
overlay names, with JupyterHub at the version images/constraints.txt pins: the lower end of
the supported range; images/proxy for z2jh's configurable-http-proxy), with the rendered
ConfigMap, Secret, env and volumes, as tests/kube/containers.py's harness runs the gpuslice
chart. So z2jh's own files/hub/jupyterhub_config.py runs unchanged, in the image, with
tornado's curl client (pycurl), its dict-valued volumes, its services' env, the hub
ServiceAccount's token against the API double over TLS enforcing the RBAC the two charts
grant (z2jh's Role and the companion's ClusterRole), and the notebook pod run by the double's
kubelet as a container of the notebook image. The double runs only the scheduler configured
with gpushare's extender (default-scheduler): z2jh's user scheduler has none and is not run.

Only test-local settings are added as a third values file, through z2jh's own pass-through:
the admin service's token, the GPU line's timings.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.kube.conftest import gpushare_node
from tests.kube.containers import Cluster
from tests.kube.images import build, missing_tools
from tests.kube.z2jh import hub_deployment, render_companion, render_z2jh

pytestmark = pytest.mark.e2e
REPO = Path(__file__).parents[2]
NAMESPACE = "jhub"
CONSTRAINTS = REPO / "images" / "constraints.txt"


def local_values(root: Path, admin_token: str) -> Path:
    values = {
        "hub": {
            "config": {"KubeGpuSpawner": {"gpu_inventory_ttl": 1, "http_timeout": 60}},
            "services": {"test-admin": {"apiToken": admin_token}},
            "loadRoles": {
                "test-admin": {"services": ["test-admin"], "scopes": ["admin:users", "admin:servers", "access:servers"]}
            },
        },
        "singleuser": {"startTimeout": 120},
        "custom": {"gpuslice": {"gpuIdleTimeout": 300}},  # the reclaimer's timeout, read by the overlay
    }
    path = root / "local.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def cluster_admin() -> list[dict[str, Any]]:
    """A cluster admin (a User, as `kubectl` would be) for the test's own reads of the API."""
    return [
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


def image_of(docs: list[dict[str, Any]], name: str) -> str:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def test_z2jhs_own_config_in_the_hub_image_spawns_a_gpu_server_through_kube_gpu_spawner(tmp_path: Path) -> None:
    if missing_tools():
        message = f"the hub image runs under podman: missing {', '.join(missing_tools())} (scripts/setup installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    admin_token = secrets.token_hex(16)
    z2jh = render_z2jh(local_values(tmp_path, admin_token))
    assert hub_deployment(z2jh)["spec"]["template"]["spec"]["serviceAccountName"] == "hub"
    args = hub_deployment(z2jh)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["jupyterhub", "--config", "/usr/local/etc/jupyterhub/jupyterhub_config.py"]
    assert "--upgrade-db" in args
    built = {name: build(name) for name in ("hub", "proxy", "notebook-base")}
    pulls = {  # what the rendered charts name, as built here
        image_of(z2jh, "hub"): built["hub"],
        image_of(z2jh, "proxy"): built["proxy"],
        "ghcr.io/gpuslice/notebook-base:1.0": built["notebook-base"],
    }
    cluster = Cluster(
        tmp_path,
        [gpushare_node("gpu-a", 1, 15)],
        namespace=NAMESPACE,
        pulls=pulls,
        reader="hub",
        rbac_extra=[*render_companion(), *cluster_admin()],
        tokens_extra={admin_token: "test-admin"},
        api_args=("--schedulers", "default-scheduler"),
    )
    cluster.docs = z2jh
    try:
        cluster.create_network()
        cluster.start_api()
        cluster.apply(z2jh, publish={"proxy": [8000]}, only={"hub", "proxy"})
        public = cluster.url("proxy", 8000)
        cluster.wait_for(f"{public}/hub/health", timeout_s=180)
        log = cluster.logs("hub") + hub_log_head(cluster)
        pinned = re.search(r"^jupyterhub==(\S+)$", CONSTRAINTS.read_text(), re.MULTILINE)
        assert pinned and f"Running JupyterHub version {pinned.group(1)}" in log  # the image's JupyterHub
        assert "Loading pass-through config section hub.config.KubeGpuSpawner" in log
        # The overlay's extraConfig adds the GPU line's hub side: the reclaimer runs, and the
        # warnings' page is there and asks who is looking (a login redirect, not a 404).
        assert "Loading extra config: gpuslice" in log
        assert logged(cluster, "Starting service 'gpu-reclaimer'"), "the gpu-reclaimer did not start"
        assert "--gpu-idle-timeout=300" in hub_log_head(cluster)  # custom.gpuslice.gpuIdleTimeout
        anonymous = requests.get(f"{public}/hub/gpuslice/notice", allow_redirects=False, timeout=30)
        assert anonymous.status_code == 302 and "/hub/login" in anonymous.headers["Location"], anonymous.status_code

        admin = {"Authorization": f"token {admin_token}"}
        assert requests.post(f"{public}/hub/api/users/gina", headers=admin, timeout=30).status_code == 201
        started = requests.post(
            f"{public}/hub/api/users/gina/server", headers=admin, json={"gpu_memory": "4GiB"}, timeout=60
        )
        assert started.status_code in (201, 202), started.text
        wait_ready(public, admin, "gina", cluster)

        pod = cluster.k8s(f"/api/v1/namespaces/{NAMESPACE}/pods/jupyter-gina")
        spec = pod["spec"]
        assert spec["schedulerName"] == "default-scheduler"  # the one with gpushare's extender
        assert spec["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
        assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "0"  # placed by the extender
        assert {"name": "volume-gina", "persistentVolumeClaim": {"claimName": "claim-gina"}} in spec["volumes"]
        assert spec["containers"][0]["image"] == "ghcr.io/gpuslice/notebook-base:1.0"
        assert [c["name"] for c in spec.get("initContainers") or []] == ["block-cloud-metadata"]  # gpushare: kept
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "jhub"  # z2jh's common labels
        # the notebook container answers through z2jh's proxy: the route the hub added
        lab = requests.get(f"{public}/user/gina/api", headers=admin, timeout=30)
        assert lab.status_code == 200 and "version" in lab.json(), lab.text[:300]
    finally:
        cluster.stop()


def hub_log_head(cluster: Cluster) -> str:
    """The hub container's whole log (cluster.logs keeps the last lines)."""
    from tests.kube.images import podman

    found = podman("logs", cluster.containers["hub"], check=False)
    return found.stdout + found.stderr


def logged(cluster: Cluster, text: str, timeout_s: float = 60) -> bool:
    """Whether text appears in the hub's log within timeout_s (the hub starts its services as it starts)."""
    deadline = time.monotonic() + timeout_s
    while text not in hub_log_head(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_ready(public: str, headers: dict[str, str], user: str, cluster: Cluster, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server = requests.get(f"{public}/hub/api/users/{user}", headers=headers, timeout=30).json()["servers"].get("")
        if server and server.get("ready"):
            return
        if not server or not server.get("pending"):
            raise AssertionError(f"{user}'s server stopped while starting: {server}; hub: {cluster.logs('hub')}")
        time.sleep(0.5)
    raise AssertionError(f"{user}'s server not ready in {timeout_s}s; hub: {cluster.logs('hub')}")
