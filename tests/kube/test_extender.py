"""The scheduler extender over HTTP, called by the API double's scheduler as kube-scheduler calls it."""

import asyncio
import json
import random
from collections import Counter
from enum import StrEnum
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from bench.placement import TraceNode, TraceTask, arrivals, read_nodes, read_tasks
from hub.extender import RestKubeClient, make_app
from spawner.extender import pod_demand
from spawner.placement import ClusterState, Demand, known_workload, make_policy
from spawner.sharing import backend as sharing
from spawner.sharing import build_kube
from tests.kube.apiserver import ApiServer
from tests.shared import shared_file

GiB, MiB = 2**30, 2**20
NOW_NS = 1_700_000_000_123_456_789


class Backend(StrEnum):
    GPUSHARE = "gpushare"
    HAMI = "hami"


def node(name: str, backend: Backend, cards: int, gib: int, model: str, cpu: str = "16") -> dict[str, Any]:
    allocatable: dict[str, str] = {"cpu": cpu, "memory": "64Gi", "pods": "110"}
    meta: dict[str, Any] = {"name": name, "labels": {"nvidia.com/gpu.product": model}}
    if backend is Backend.GPUSHARE:
        allocatable |= {"aliyun.com/gpu-count": str(cards), "aliyun.com/gpu-mem": str(cards * gib)}
    else:
        allocatable["nvidia.com/gpu"] = str(cards * 10)  # HAMi's device plugin: 10 vGPUs per card
        register = [
            {"id": f"GPU-{name}-{i}", "count": 10, "devmem": gib * 1024, "devcore": 100, "type": model, "health": True}
            for i in range(cards)
        ]
        meta["annotations"] = {"hami.io/node-nvidia-register": json.dumps(register)}
    status = {"allocatable": allocatable, "capacity": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}
    return {"kind": "Node", "apiVersion": "v1", "metadata": meta, "status": status}


def pod(name: str, backend: Backend, gib: int = 0, cards: int = 0, cpu: str = "2", model: str = "") -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": cpu, "memory": "4Gi"}
    if gib and backend is Backend.GPUSHARE:
        limits["aliyun.com/gpu-mem"] = str(gib)
    elif gib:
        limits |= {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(gib * 1024)}
    if cards:
        limits["nvidia.com/gpu"] = str(cards)
    spec: dict[str, Any] = {
        "schedulerName": "gpuslice-scheduler",
        "containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}],
    }
    if model:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": model}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def cluster(backend: Backend) -> list[dict[str, Any]]:
    return [
        node("a", backend, 2, 16, "Tesla-T4", cpu="8"),
        node("b", backend, 4, 32, "V100"),
        node("c", backend, 1, 40, "A100"),
    ]


def workload(backend: Backend) -> list[dict[str, Any]]:
    """Slices of several sizes, whole cards and model-bound pods; the last ones do not fit. (No CPU-only
    pod: kube-scheduler asks the extender only about pods that ask for a resource it manages.)"""
    shapes = [(4, 0, "2", ""), (8, 0, "2", ""), (12, 0, "1", ""), (0, 1, "2", ""), (16, 0, "2", "V100")]
    shapes += [(4, 0, "6", ""), (20, 0, "2", ""), (6, 0, "1", "Tesla-T4"), (0, 2, "2", "")]
    shapes += [(10, 0, "1", ""), (2, 0, "1", ""), (30, 0, "1", ""), (0, 4, "1", ""), (36, 0, "1", "")]
    if backend is Backend.GPUSHARE:  # gpushare's nodes offer only aliyun.com/gpu-mem, no whole cards
        shapes = [s for s in shapes if not s[1]]
    return [pod(f"p{i:02d}", backend, gib, cards, cpu, model) for i, (gib, cards, cpu, model) in enumerate(shapes)]


def direct(
    backend: Backend, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[tuple[str, tuple[int, ...]]]:
    """The policy called directly: the same arrivals, what it knows live (every arrival so far: a
    refused pod stays pending, and is seen), commits in memory."""
    inventory = build_kube(nodes, [], sharing(backend))
    state = ClusterState.from_inventory(inventory)
    arrived: Counter[Demand] = Counter()
    decisions: list[tuple[str, tuple[int, ...]]] = []
    for p in pods:
        demand = pod_demand(p, sharing(backend))
        choice = make_policy("default", known_workload(arrived, demand)).choose(state, demand)
        arrived[demand] += 1
        if choice is None:
            decisions.append(("", ()))
            continue
        state.commit(choice, demand)
        decisions.append((state.names[choice.node], choice.gpus))
    return decisions


def placed_on(backend: Backend, p: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[str, tuple[int, ...]]:
    """Where the pod landed, read back from its node and device annotations."""
    name = p["spec"].get("nodeName", "")
    notes = p["metadata"].get("annotations") or {}
    if not name:
        return "", ()
    if backend is Backend.GPUSHARE:
        if "ALIYUN_COM_GPU_MEM_IDX" in notes:
            return name, (int(notes["ALIYUN_COM_GPU_MEM_IDX"]),)
        return name, tuple(range(int(p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))))
    if "hami.io/vgpu-devices-to-allocate" not in notes:
        return name, ()
    uuids = [d.split(",")[0] for d in notes["hami.io/vgpu-devices-to-allocate"].rstrip(";").split(":") if d]
    return name, tuple(int(u.rsplit("-", 1)[1]) for u in uuids)


async def through_the_extender(
    backend: Backend, pods: list[dict[str, Any]], nodes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    api = ApiServer(nodes or cluster(backend), kubelet=False, namespaces=("ns",))
    api_server = TestServer(api.app(), host="127.0.0.1")
    await api_server.start_server()
    client = RestKubeClient(str(api_server.make_url("")))
    ext_server = TestServer(make_app(client, sharing(backend), "default", clock=lambda: NOW_NS), host="127.0.0.1")
    await ext_server.start_server()
    api.extender = str(ext_server.make_url("")).rstrip("/")
    results = []
    try:
        async with aiohttp.ClientSession(str(api_server.make_url(""))) as http:
            for p in pods:
                async with http.post("/api/v1/namespaces/ns/pods", json=p) as response:
                    assert response.status == 201, await response.text()
                results.append(await settled(http, p["metadata"]["name"]))
    finally:
        await ext_server.close()
        await api_server.close()
    return results


async def settled(http: aiohttp.ClientSession, name: str) -> dict[str, Any]:
    """The pod once the scheduler has bound it or given up on it."""
    for _ in range(200):
        async with http.get(f"/api/v1/namespaces/ns/pods/{name}") as response:
            obj: dict[str, Any] = await response.json()
        async with http.get("/api/v1/namespaces/ns/events") as response:
            events = [e for e in (await response.json())["items"] if e["involvedObject"]["name"] == name]
        if obj["spec"].get("nodeName") or any(e["reason"] == "FailedScheduling" for e in events):
            return obj
        await asyncio.sleep(0.02)
    raise AssertionError(f"pod {name} was neither bound nor refused")


@pytest.mark.parametrize("backend", [Backend.HAMI, Backend.GPUSHARE])
def test_the_extender_over_http_decides_as_the_policy_called_directly(backend: Backend) -> None:
    pods = workload(backend)
    bound = asyncio.run(through_the_extender(backend, pods))
    got = [placed_on(backend, p, cluster(backend)) for p in bound]
    assert got == direct(backend, cluster(backend), pods)
    assert sum(1 for n, _ in got if n) >= 8 and any(not n for n, _ in got)


def trace_node(trace: TraceNode, index: int) -> dict[str, Any]:
    """A trace node as HAMi registers it: its cores, memory and cards, each card 1000 MiB, so a
    task's gpu_milli is its slice in MiB and the policy sees the trace's own units."""
    obj = node(f"n{index:02d}", Backend.HAMI, trace.gpus, 0, trace.model, cpu=f"{trace.cpu_milli}m")
    obj["status"]["allocatable"]["memory"] = f"{trace.memory_mib}Mi"
    register = json.loads(obj["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    for card in register:
        card["devmem"] = 1000
    obj["metadata"]["annotations"]["hami.io/node-nvidia-register"] = json.dumps(register)
    return obj


def trace_pod(task: TraceTask, index: int) -> dict[str, Any]:
    obj = pod(f"t{index:03d}", Backend.HAMI, cpu=f"{task.cpu_milli}m", model=min(task.gpu_spec or {""}))
    limits = obj["spec"]["containers"][0]["resources"]["limits"]
    limits["memory"] = f"{task.memory_mib}Mi"
    if task.num_gpu == 1 and task.gpu_milli < 1000:
        limits |= {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(task.gpu_milli)}
    else:
        limits["nvidia.com/gpu"] = str(task.num_gpu)
    return obj


@pytest.mark.slow
@pytest.mark.parametrize("pod_list", ["default", "multigpu20"])
def test_trace_arrivals_through_the_extender_decide_as_the_policy_called_directly(pod_list: str) -> None:
    """A replay of a real pod list on real trace nodes, through kube-scheduler's extender protocol.

    Twelve trace nodes drawn with a fixed seed; the list's arrivals (bench.placement's draw)
    until their GPU demand fills those nodes' cards. Left out, as the extender is never asked
    about them or a node selector cannot say them: CPU-only tasks and tasks that accept two
    GPU models."""
    data = shared_file("data/alibaba-gpu-v2023")
    trace_nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    drawn = random.Random(17).sample(trace_nodes, 12)
    tasks = [
        t
        for t in read_tasks(data / f"openb_pod_list_{pod_list}.csv")
        if t.num_gpu and (t.gpu_spec is None or len(t.gpu_spec) == 1)
    ]
    nodes = [trace_node(n, i) for i, n in enumerate(drawn)]
    pods = [trace_pod(t, i) for i, t in enumerate(arrivals(tasks, float(sum(n.gpus for n in drawn)), 0))]
    bound = asyncio.run(through_the_extender(Backend.HAMI, pods, nodes))
    got = [placed_on(Backend.HAMI, p, nodes) for p in bound]
    assert got == direct(Backend.HAMI, nodes, pods)
    assert sum(1 for n, _ in got if n) >= len(pods) // 2  # most arrivals placed: a real replay, not all refusals


def test_bind_writes_the_device_plugins_annotations() -> None:
    hami = asyncio.run(through_the_extender(Backend.HAMI, [pod("x", Backend.HAMI, gib=8, model="A100")]))[0]
    notes = hami["metadata"]["annotations"]
    assert notes["hami.io/vgpu-devices-to-allocate"] == "GPU-c-0,NVIDIA,8192,0:;"
    assert notes["hami.io/vgpu-devices-allocated"] == notes["hami.io/vgpu-devices-to-allocate"]
    assert notes["hami.io/vgpu-node"] == "c" and hami["spec"]["nodeName"] == "c"
    assert notes["hami.io/bind-phase"] == "allocating"
    assert notes["hami.io/vgpu-time"] == notes["hami.io/bind-time"] == str(NOW_NS // 10**9)
    share = asyncio.run(through_the_extender(Backend.GPUSHARE, [pod("y", Backend.GPUSHARE, gib=8, model="A100")]))[0]
    assert {k: v for k, v in share["metadata"]["annotations"].items() if k.startswith("ALIYUN")} == {
        "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_POD": "8",
        "ALIYUN_COM_GPU_MEM_DEV": "40",
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME": str(NOW_NS),
    }


def test_filter_says_why_each_node_is_out() -> None:
    from spawner.extender import filter_nodes, prioritize

    nodes = cluster(Backend.HAMI)
    args = {"Pod": pod("big", Backend.HAMI, gib=24), "Nodes": None, "NodeNames": ["a", "b", "c", "gone"]}
    answer = filter_nodes(args, nodes, [], sharing(Backend.HAMI))
    assert answer["NodeNames"] == ["b", "c"] and answer["Nodes"] is None
    # a's cards hold 16 GiB each, "gone" is no node: preempting pods would not help either
    assert set(answer["FailedAndUnresolvableNodes"]) == {"a", "gone"} and not answer["FailedNodes"]
    assert "The largest free slice is 16 GiB on a GPU" in answer["FailedAndUnresolvableNodes"]["a"]
    listed = {"Pod": args["Pod"], "Nodes": {"items": nodes}, "NodeNames": None}
    by_nodes = filter_nodes(listed, nodes, [], sharing(Backend.HAMI))
    assert [n["metadata"]["name"] for n in by_nodes["Nodes"]["items"]] == ["b", "c"] and by_nodes["NodeNames"] is None
    scores = prioritize({**args, "NodeNames": ["b", "c"]}, nodes, [], sharing(Backend.HAMI), "default")
    assert sorted(s["Score"] for s in scores) == [0, 10]


def test_the_charts_scheduler_asks_the_extender_as_the_double_does(tmp_path: Any) -> None:
    """The KubeSchedulerConfiguration the chart ships: the verbs the extender serves, the
    cache mode and managed resources the API double's scheduler assumes."""
    from tests.helm.test_chart import render
    from tests.kube.apiserver import MANAGED

    values = tmp_path / "on.yaml"
    values.write_text("schedulerExtender: {enabled: true}\ngpuSharing: {backend: hami, policy: default}\n")
    docs = render(values)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler"))
    scheduler = yaml.safe_load(config["data"]["config.yaml"])
    (ext,) = scheduler["extenders"]
    routes = {r.resource.canonical for r in make_app(RestKubeClient("http://x"), sharing(Backend.HAMI)).router.routes()}
    assert {f"/{ext[v]}" for v in ("filterVerb", "prioritizeVerb", "bindVerb")} <= routes
    assert ext["nodeCacheCapable"] is True
    assert {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]} == MANAGED
    assert scheduler["profiles"][0]["schedulerName"] == "gpuslice-scheduler"
    hub = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-hub"))
    assert yaml.safe_load(hub["data"]["values.yaml"])["schedulerName"] == "gpuslice-scheduler"
    assert not any(d["metadata"]["name"].endswith("-scheduler") for d in render())  # off by default
