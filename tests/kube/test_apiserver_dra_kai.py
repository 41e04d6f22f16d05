"""The API double's resource.k8s.io/v1 and KAI Scheduler as gpuslice's pods meet them (in process, no kubelet).

Objects: tests/spawner/sharing/fixtures/dra_cluster.yaml and kai_cluster.yaml (their sources cited there).
"""

import asyncio
import copy
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from portal.data.cluster import KubeClient, kai_queue
from spawner import sharing
from spawner.shares import GiB, GpuRequest
from spawner.sharing.base import Target
from spawner.sharing.dra import Dra
from spawner.sharing.kai import Kai
from tests.kube.apiserver import ApiServer
from tests.kube.dra import UnsupportedCelError, cel_selects

FIXTURES = Path(__file__).parents[1] / "spawner" / "sharing" / "fixtures"


def items(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((FIXTURES / name).read_text())["items"]
    return found


def notebook(user: str, **spec: Any) -> dict[str, Any]:
    meta = {"name": f"jupyter-{user}", "annotations": {"hub.jupyter.org/username": user}}
    container = {"name": "notebook", "image": "nb"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container], **spec}}


async def settle(http: aiohttp.ClientSession, name: str) -> dict[str, Any]:
    for _ in range(200):
        async with http.get(f"/api/v1/namespaces/ns/pods/{name}") as response:
            pod: dict[str, Any] = await response.json()
        if pod["spec"].get("nodeName") or pod["status"].get("conditions"):
            return pod
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} neither bound nor refused")


async def with_double(nodes: list[dict[str, Any]], run: Any, schedulers: frozenset[str] = frozenset()) -> Any:
    api = ApiServer(nodes, kubelet=False, schedulers=frozenset({"default-scheduler", *schedulers}), namespaces=("ns",))
    server = TestServer(api.app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as http:
            return await run(http)
    finally:
        await server.close()


async def post(http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(path, json=body) as response:
        assert response.status == 201, await response.text()
        found: dict[str, Any] = await response.json()
        return found


async def listed(http: aiohttp.ClientSession, path: str) -> list[dict[str, Any]]:
    async with http.get(path) as response:
        found: list[dict[str, Any]] = (await response.json())["items"]
        return found


def test_the_double_allocates_shared_gpu_claims_by_capacity_and_refuses_as_kube_scheduler_does() -> None:
    objects = items("dra_cluster.yaml")
    nodes = [o for o in objects if o["kind"] == "Node"]
    spec = Dra().render(GpuRequest(memory_bytes=24 * GiB), Target(card_bytes=40 * GiB))
    assert spec.claim is not None

    async def run(http: aiohttp.ClientSession) -> tuple[list[dict[str, Any]], ...]:
        for obj in objects:
            if obj["kind"] in ("DeviceClass", "ResourceSlice"):
                plural = {"DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices"}[obj["kind"]]
                await post(http, f"/apis/resource.k8s.io/v1/{plural}", obj)
        pods = []
        for user in ("ann", "bob", "cara"):  # 24 GiB each: one per 40 GiB card, the third has no room
            template = {"metadata": {"name": f"jupyter-{user}-gpu"}, "spec": spec.claim}
            await post(http, "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates", template)
            pod = notebook(user, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": f"jupyter-{user}-gpu"}])
            await post(http, "/api/v1/namespaces/ns/pods", pod)
            pods.append(await settle(http, f"jupyter-{user}"))
        claims = await listed(http, "/apis/resource.k8s.io/v1/resourceclaims")
        slices = await listed(http, "/apis/resource.k8s.io/v1/resourceslices")
        events = await listed(http, "/api/v1/namespaces/ns/events")
        async with http.delete("/api/v1/namespaces/ns/pods/jupyter-ann") as response:
            assert response.status == 200
        return pods, claims, slices, events, await listed(http, "/apis/resource.k8s.io/v1/resourceclaims")

    pods, claims, slices, events, after = asyncio.run(with_double(nodes, run))
    assert [p["spec"].get("nodeName") for p in pods] == ["gpu-a", "gpu-a", None]
    devices = {c["metadata"]["ownerReferences"][0]["name"]: c["status"].get("allocation") for c in claims}
    assert devices["jupyter-ann"]["devices"]["results"][0]["device"] == "gpu-0"
    assert devices["jupyter-bob"]["devices"]["results"][0]["device"] == "gpu-1"
    assert devices["jupyter-cara"] is None
    refused = [e["message"] for e in events if e["reason"] == "FailedScheduling"]
    assert refused == [
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling."
    ]
    assert pods[2]["status"]["conditions"][0] | {"lastTransitionTime": ""} == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": refused[0],
        "lastTransitionTime": "",
    }
    # gpuslice reads it back: each card with its owner, the third pod holding nothing.
    inventory = sharing.build_kube(nodes, pods, Dra(), objects={"resourceslices": slices, "resourceclaims": claims})
    assert [[(a.user, a.memory_bytes) for a in g.allocations] for g in inventory.gpus()] == [
        [("ann", 24 * GiB)],
        [("bob", 24 * GiB)],
    ]
    assert "jupyter-ann" not in {c["metadata"]["ownerReferences"][0]["name"] for c in after}  # its claim went with it


def test_the_double_evaluates_only_the_cel_it_knows() -> None:
    device = {"attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-1"}}}
    assert cel_selects(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "gpu.nvidia.com",
        device,
    )
    assert not cel_selects("device.attributes['gpu.nvidia.com'].uuid == 'GPU-2'", "gpu.nvidia.com", device)
    with pytest.raises(UnsupportedCelError, match="capacity"):
        cel_selects(
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('4Gi')) >= 0", "gpu.nvidia.com", device
        )


def test_the_double_places_kai_fractions_with_a_reservation_pod_and_refuses_in_kais_words() -> None:
    node = copy.deepcopy(next(o for o in items("kai_cluster.yaml") if o["kind"] == "Node"))
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "6144"
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "1"
    parent = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "gpuslice"}, "spec": {}}
    queue = {**parent, "metadata": {"name": "ml101"}, "spec": {"parentQueue": "gpuslice"}}

    async def run(http: aiohttp.ClientSession) -> tuple[Any, ...]:
        await post(http, "/apis/scheduling.run.ai/v2/queues", parent)
        await post(http, "/apis/scheduling.run.ai/v2/queues", queue)
        pods = []
        for user in ("gina", "hal"):  # 4 GiB each on a 6 GiB card: the second does not fit
            spec = Kai().render(GpuRequest(memory_bytes=4 * GiB), Target(group="ml101"))
            pod = notebook(user, schedulerName=spec.scheduler_name)
            pod["metadata"]["labels"] = spec.labels
            pod["metadata"]["annotations"].update(spec.annotations)
            await post(http, "/api/v1/namespaces/ns/pods", pod)
            pods.append(await settle(http, f"jupyter-{user}"))
        lost = notebook("ivy", schedulerName="kai-scheduler")
        lost["metadata"]["labels"] = {"kai.scheduler/queue": "nowhere"}
        await post(http, "/api/v1/namespaces/ns/pods", lost)
        pods.append(await settle(http, "jupyter-ivy"))
        queues = {q["metadata"]["name"]: q["status"] for q in await listed(http, "/apis/scheduling.run.ai/v2/queues")}
        # The portal's data layer reads the class's queue as its Teaching page shows it (its client is blocking).
        async with http.get("/version") as response:
            client = KubeClient(str(response.url).removesuffix("/version"), token="")
        seen = await asyncio.to_thread(kai_queue, client, "ns", Kai(), "ml101")
        async with http.delete("/api/v1/namespaces/ns/pods/jupyter-gina") as response:
            assert response.status == 200
        for _ in range(200):  # gina's pod gone, KAI places hal in her GPU group; the queue follows
            async with http.get("/apis/scheduling.run.ai/v2/queues/ml101") as response:
                after = (await response.json())["status"]
            if after.get("requested") == {"run.ai/gpu.memory": "4096"} and "allocated" in after:
                break
            await asyncio.sleep(0.02)
        reservations = await listed(http, "/api/v1/namespaces/kai-resource-reservation/pods")
        return pods, reservations, queues, seen, after

    pods, reservations, queues, seen, after = asyncio.run(with_double([node], run, frozenset({"kai-scheduler"})))
    gina, hal, ivy = pods
    (reservation,) = reservations
    assert gina["spec"]["nodeName"] == "gpu-k" and reservation["spec"]["nodeName"] == "gpu-k"
    assert gina["metadata"]["labels"]["runai-gpu-group"] == reservation["metadata"]["labels"]["runai-gpu-group"]
    assert (
        hal["status"]["conditions"][0]["message"]
        == "0/1 nodes are available: 1 node(s) didn't have enough resources: GPUs."
    )
    assert ivy["status"]["conditions"][0]["message"] == "queue nowhere does not exist"
    inventory = sharing.build_kube([node], pods, Kai(), objects={"kai-reservations": reservations})
    assert [[(a.user, a.memory_bytes) for a in g.allocations] for g in inventory.gpus()] == [[("gina", 4 * GiB)]]
    # KAI's controllers count the queue: gina's 4096 of 6144 MiB allocated (a fraction rounded up to nano), both
    # asked as memory; the parent sums its child.
    assert queues["ml101"] == {
        "allocated": {"nvidia.com/gpu": "666666667n"},
        "requested": {"run.ai/gpu.memory": "8192"},
    }
    assert queues["gpuslice"] == {**queues["ml101"], "childQueues": ["ml101"]}
    assert (seen.parent, seen.allocated_gpus, seen.requested_memory_bytes) == ("gpuslice", 0.666666667, 8 * GiB)
    assert [(w.user, w.reason) for w in seen.waiting] == [("hal", hal["status"]["conditions"][0]["message"])]
    assert after == {"allocated": {"nvidia.com/gpu": "666666667n"}, "requested": {"run.ai/gpu.memory": "4096"}}
