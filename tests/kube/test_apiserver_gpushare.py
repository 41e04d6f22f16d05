"""The API double's gpushare extender counts and annotates as gpushare's own code does.

The pods and nodes are the fixtures read from gpushare's sources (tests/spawner/sharing/fixtures).
"""

import asyncio
from pathlib import Path
from typing import Any

import yaml

from spawner.sharing import build_kube
from spawner.sharing.gpushare import Gpushare
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import gpushare_node

FIXTURES = Path(__file__).parents[1] / "spawner" / "sharing" / "fixtures"


def items(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((FIXTURES / name).read_text())["items"]
    return found


def server_with(pod_names: set[str]) -> tuple[ApiServer, dict[str, Any]]:
    server = ApiServer([], kubelet=False)
    node = next(o for o in items("gpushare_nodes.yaml") if o["metadata"]["name"] == "t4-gib")
    pods = [p for p in items("gpushare_pods.yaml") if p["metadata"]["name"] in pod_names]

    async def load() -> None:
        for pod in pods:
            await server.store.put("pods", "jhub", pod, "ADDED")

    asyncio.run(load())
    return server, node


def test_cards_come_from_capacity_and_deleting_pods_are_free() -> None:
    # alice (4) and bob (6, not yet assigned) on card 0, carol (5) is being deleted: 5 of 15 left there.
    server, node = server_with({"jupyter-alice", "jupyter-bob", "jupyter-carol"})
    assert server._gpushare_card(node, 5) == 0  # best fit: the fuller card that still has room
    assert server._gpushare_card(node, 6) == 1
    assert server._gpushare_card(node, 16) == -1


def test_annotations_are_the_extenders_and_the_inventory_reads_them() -> None:
    server, node = server_with(set())
    annotations = server._gpushare_annotations(node, 1, {"aliyun.com/gpu-mem": 3})
    assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == "15" and annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert int(annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"]) > 10**18  # UnixNano
    pod = next(p for p in items("gpushare_pods.yaml") if p["metadata"]["name"] == "jupyter-grace")
    pod["metadata"]["annotations"] = annotations
    pod["spec"]["nodeName"] = "t4-gib"
    ApiServer._gpushare_assign(pod)
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
    inventory = build_kube([node], [pod], Gpushare())
    assert [len(g.allocations) for g in inventory.gpus()] == [0, 1]


def test_a_finished_pods_room_is_free_and_the_waiting_pod_is_placed() -> None:
    # As kube-scheduler, whose informer lists no Succeeded or Failed pod: a Job's finished pod stays, its card frees.
    server = ApiServer([], kubelet=False)
    node = gpushare_node("gpu-a", 1, 8)

    def pod(name: str, gib: int) -> dict[str, Any]:
        limits = {"aliyun.com/gpu-mem": str(gib)}
        return {
            "metadata": {"name": name, "namespace": "jhub", "uid": name, "creationTimestamp": name},
            "spec": {"containers": [{"name": "job", "resources": {"limits": limits}}]},
            "status": {},
        }

    async def run() -> None:
        await server.store.put("nodes", None, node, "ADDED")
        done = pod("job-1", 8)
        done["spec"]["nodeName"] = "gpu-a"
        done["status"]["phase"] = "Running"
        await server.store.put("pods", "jhub", done, "ADDED")
        await server.store.put("pods", "jhub", pod("job-2", 4), "ADDED")
        await server._schedule("jhub", "job-2")
        waiting = server.store.get("pods", "jhub", "job-2")
        assert waiting is not None and not waiting["spec"].get("nodeName")
        assert "1 Insufficient aliyun.com/gpu-mem" in waiting["status"]["conditions"][0]["message"]
        done["status"]["phase"] = "Succeeded"
        await server._finished(done)
        assert waiting["spec"].get("nodeName") == "gpu-a"
        assert server._free(node)["aliyun.com/gpu-mem"] == 4

    asyncio.run(run())
