"""The pod KubeGpuSpawner builds from Zero to JupyterHub's own config (unchanged) with each overlay, no hub started.

z2jh's files/hub/jupyterhub_config.py is loaded as JupyterHub loads it (traitlets'
PyFileConfigLoader) from the rendered ConfigMap and Secret at /usr/local/etc/jupyterhub, in a
private mount namespace; KubeGpuSpawner, configured by it, renders one GPU pod.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kube.z2jh import DRA, HAMI, KAI, hub_env, in_hub_paths, lay_out, render_z2jh

REPO = Path(__file__).parents[2]
RENDER_POD = """
import asyncio, json
from jupyterhub.objects import Hub
from kubernetes_asyncio.client import ApiClient
from traitlets.config.loader import PyFileConfigLoader
from spawner.kube import KubeGpuSpawner
from spawner.shares import parse_request
from tests.kube.test_kube_spawner import StubUser

config = PyFileConfigLoader("jupyterhub_config.py", path="/usr/local/etc/jupyterhub").load_config()

async def main():
    spawner = KubeGpuSpawner(config=config, hub=Hub(), user=StubUser("gina"), api_token="t",
                             oauth_client_id="jupyterhub-user-gina", _mock=True)
    request = parse_request("4GiB", 0, largest_card_bytes=16 * 2**30, most_cards=1)
    spawner._apply(request, spawner.image, None, [])
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as client:
        print(json.dumps(client.sanitize_for_serialization(pod)))

asyncio.run(main())
"""


def pod_from_z2jh_config(tmp_path: Path, *values: Path) -> dict[str, Any]:
    docs = render_z2jh(*values)
    lay_out(docs, tmp_path / "etc")
    env = {
        **hub_env(docs, "jhub"),
        "HUB_SERVICE_PORT": "8081",
        "PROXY_API_SERVICE_PORT": "8001",
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": os.environ["KUBECONFIG"],  # KubeSpawner loads one even when it calls nothing (tests/conftest.py)
    }
    command = in_hub_paths(tmp_path / "etc", [sys.executable, "-c", RENDER_POD])
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("values", "scheduler", "limits", "init"),
    [
        ((), "default-scheduler", {"aliyun.com/gpu-mem": "4"}, ["block-cloud-metadata"]),
        ((HAMI,), "hami-scheduler", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}, []),
        ((DRA,), "default-scheduler", {}, ["block-cloud-metadata"]),  # the GPU is the pod's claim
        ((KAI,), "kai-scheduler", {}, ["block-cloud-metadata"]),  # the slice is KAI's gpu-memory annotation
    ],
    ids=["gpushare", "hami", "dra", "kai"],
)
def test_z2jhs_config_gives_kube_gpu_spawner_a_pod_its_backend_admits(
    tmp_path: Path, values: tuple[Path, ...], scheduler: str, limits: dict[str, str], init: list[str]
) -> None:
    pod = pod_from_z2jh_config(tmp_path, *values)
    spec = pod["spec"]
    assert spec["schedulerName"] == scheduler
    assert {k: v for k, v in spec["containers"][0]["resources"]["limits"].items() if "/" in k} == limits
    assert [c["name"] for c in spec.get("initContainers") or []] == init
    # HAMi's webhook denies a GPU pod with a privileged container: with HAMi there is none.
    privileged = [c["name"] for c in spec.get("initContainers") or [] if c["securityContext"].get("privileged")]
    assert privileged == init
    assert {"name": "volume-gina", "persistentVolumeClaim": {"claimName": "claim-gina"}} in spec["volumes"]
