"""KubeGpuSpawner's cluster listing under the RBAC the charts grant, against the API double enforcing it."""

import json
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from spawner.kube import ApiUnavailableError, ClusterCache
from tests.kube.conftest import gpushare_node, start_api_double
from tests.kube.test_kube_spawner import LOOP, make
from tests.kube.z2jh import rbac_objects, render_companion, render_z2jh

HUB = "system:serviceaccount:jhub:hub"  # z2jh's hub ServiceAccount


@pytest.fixture
def api_url(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The double enforcing z2jh's RBAC, plus the companion's when the test is parametrized with True."""
    token = secrets.token_hex(8)
    z2jh = render_z2jh()
    objects = rbac_objects(z2jh, render_companion()) if request.param else rbac_objects(z2jh)
    rbac = tmp_path / "rbac.json"
    rbac.write_text(json.dumps({"tokens": {token: HUB}, "objects": objects}))
    nodes = [gpushare_node("gpu-a", 1, 15)]
    apiserver, port = start_api_double(
        tmp_path, nodes, kubelet=False, extra_args=("--rbac", str(rbac)), namespaces=("jhub",)
    )
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        apiserver.send_signal(signal.SIGTERM)
        apiserver.wait(timeout=30)


def core_api(url: str, token: str) -> ApiClient:
    config = Configuration(host=url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"})
    return ApiClient(config)


@pytest.mark.parametrize("api_url", [True], indirect=True)
def test_with_the_companion_z2jhs_hub_account_lists_the_nodes(api_url: tuple[str, str]) -> None:
    async def listing() -> list[str]:
        async with core_api(*api_url) as client:
            snapshot = await ClusterCache().get(CoreV1Api(client), "jhub", 0)
            return [n["metadata"]["name"] for n in snapshot.nodes]

    assert LOOP.run_until_complete(listing()) == ["gpu-a"]


@pytest.mark.parametrize("api_url", [False], indirect=True)
def test_without_it_the_spawn_says_what_rbac_is_missing_not_that_there_is_no_gpu(api_url: tuple[str, str]) -> None:
    async def listing() -> None:
        async with core_api(*api_url) as client:
            await ClusterCache().get(CoreV1Api(client), "jhub", 0)

    with pytest.raises(ApiException) as refused:
        LOOP.run_until_complete(listing())
    assert refused.value.status == 403
    status = json.loads(refused.value.body)
    assert (
        status["message"]
        == f'nodes is forbidden: User "{HUB}" cannot list resource "nodes" in API group "" at the cluster scope'
    )

    spawner = make("gpushare")
    spawner.namespace = "jhub-forbidden"  # its own listing cache

    async def spawn_listing() -> None:
        async with core_api(*api_url) as client:
            spawner.api = CoreV1Api(client)
            await spawner.cluster()

    with pytest.raises(ApiUnavailableError) as unavailable:
        LOOP.run_until_complete(spawn_listing())
    message = unavailable.value.jupyterhub_message
    assert "HTTP 403 Forbidden" in message and "companion mode" in message
