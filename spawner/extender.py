"""kube-scheduler extender decisions: filter, prioritize and bind by our placement policy.

Pure code: every function takes the cluster's Node and Pod objects (API JSON as dicts)
and answers in the shapes of k8s.io/kube-scheduler/extender/v1, whose Go structs have
no JSON tags, so the keys are the Go field names (``Pod``, ``Nodes``, ``NodeNames``,
``FailedNodes``, ``Host``, ``Score``, ...). ``Nodes`` and ``NodeNames`` are pointers: the
scheduler sends one of them (``NodeNames`` when the extender is ``nodeCacheCapable``) and
the answer fills the same one and leaves the other null.

On bind the pod gets the annotations the backend's device plugin reads to pick the card:
gpushare's ``ALIYUN_COM_GPU_MEM_*`` (AliyunContainerService/gpushare-scheduler-extender,
pkg/utils/pod.go) or HAMi's ``hami.io/vgpu-devices-to-allocate`` and friends
(Project-HAMi/HAMi, pkg/scheduler/scheduler.go and pkg/device/devices.go). The I/O
(reading the cluster, patching and binding the pod) is hub/extender.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from spawner.backends import (
    GPUSHARE_RESOURCE,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    NVIDIA_GPU,
    Backend,
)
from spawner.inventory import GFD_PRODUCT, Inventory, build_kube, cpu_milli, holds_resources, memory_bytes
from spawner.placement import (
    Choice,
    ClusterState,
    Demand,
    Workload,
    arrived_counts,
    explain,
    known_workload,
    make_policy,
)
from spawner.shares import GiB, MiB

Obj = Mapping[str, Any]
MAX_PRIORITY = 10  # extender/v1 MaxExtenderPriority

# gpushare-scheduler-extender, pkg/utils/const.go
GPUSHARE_COUNT = "aliyun.com/gpu-count"
GPUSHARE_IDX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_DEV = "ALIYUN_COM_GPU_MEM_DEV"
GPUSHARE_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
GPUSHARE_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
# HAMi, pkg/util/types.go and pkg/device/nvidia/device.go
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_NODE = "hami.io/vgpu-node"
HAMI_TIME = "hami.io/vgpu-time"
HAMI_BIND_PHASE = "hami.io/bind-phase"
HAMI_BIND_TIME = "hami.io/bind-time"
HAMI_NVIDIA = "NVIDIA"  # the device type HAMi writes for NVIDIA cards


class ExtenderError(ValueError):
    """A request the extender cannot serve; the message goes back in the answer's Error."""


def _containers(pod: Obj) -> list[Obj]:
    return list(pod.get("spec", {}).get("containers") or [])


def _limit(pod: Obj, resource: str) -> int:
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(resource, 0) or 0) for c in _containers(pod))


def pod_demand(pod: Obj, backend: Backend) -> Demand:
    """What a pod asks of a node: CPU and memory requests, and its GPU resources as the
    backend's device plugin reads them; a ``nvidia.com/gpu.product`` node selector binds
    it to that model."""
    cpu = memory = 0
    for container in _containers(pod):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        cpu += cpu_milli(asked.get("cpu", 0))
        memory += memory_bytes(asked.get("memory", 0))
    product = (pod.get("spec", {}).get("nodeSelector") or {}).get(GFD_PRODUCT)
    base = Demand(cpu_milli=cpu, memory_bytes=memory, models=frozenset({product}) if product else None)
    cards = _limit(pod, NVIDIA_GPU)
    if backend is Backend.GPUSHARE and _limit(pod, GPUSHARE_RESOURCE):
        return replace(base, slice_units=float(_limit(pod, GPUSHARE_RESOURCE) * GiB))
    if backend is Backend.HAMI and cards == 1 and _limit(pod, HAMI_MEMORY):
        return replace(base, slice_units=float(_limit(pod, HAMI_MEMORY) * MiB))
    if backend is Backend.HAMI and cards == 1 and _limit(pod, HAMI_MEMORY_PERCENT):
        return replace(base, slice_fraction=_limit(pod, HAMI_MEMORY_PERCENT) / 100)
    return replace(base, gpus=cards)


def _key(pod: Obj) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


@dataclass(frozen=True)
class Cluster:
    """The cluster as the policy sees it while deciding for one pod (the pod itself left out)."""

    inventory: Inventory
    state: ClusterState
    workload: Workload
    demand: Demand

    @classmethod
    def build(cls, pod: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], backend: Backend) -> Cluster:
        others = [p for p in pods if _key(p) != _key(pod)]
        inventory = build_kube(nodes, others, backend)
        demand = pod_demand(pod, backend)
        return cls(inventory, ClusterState.from_inventory(inventory), seen_workload(others, backend, demand), demand)

    def only(self, names: Iterable[str]) -> ClusterState:
        """The state with every node outside ``names`` taking nothing."""
        keep = set(names)
        state = ClusterState.from_inventory(self.inventory)
        state.node_ok &= np.array([n in keep for n in state.names], dtype=bool)
        return state


def seen_workload(pods: Iterable[Obj], backend: Backend, demand: Demand) -> Workload:
    """The target workload: what the policy knows live (``known_workload``, the code the benchmark
    replays), the pods arrived so far, placed or still pending (a pod no node could take waits,
    and is seen), and the one being placed. Finished pods have left. CPU-only pods count, as the
    trace's workload includes them."""
    return known_workload(arrived_counts(pod_demand(p, backend) for p in pods if holds_resources(p)), demand)


def decide(cluster: Cluster, names: Iterable[str], policy: str) -> tuple[str, Choice] | None:
    state = cluster.only(names)
    choice = make_policy(policy, cluster.workload, once=True).choose(state, cluster.demand)
    return None if choice is None else (state.names[choice.node], choice)


def fits_on(state: ClusterState, demand: Demand) -> npt.NDArray[np.bool_]:
    """(N,): nodes the demand fits on now."""
    if demand.gpus:
        return state.whole_candidates(demand)
    if demand.is_slice:
        return np.asarray(state.slice_candidates(demand).any(axis=1), dtype=bool)
    return state.host_fits(demand)


def candidate_names(args: Obj) -> tuple[list[str], bool]:
    """The candidate node names, and whether they came as NodeNames (cache mode)."""
    if args.get("NodeNames") is not None:
        return list(args["NodeNames"]), True
    nodes = args.get("Nodes") or {}
    return [n["metadata"]["name"] for n in nodes.get("items") or []], False


def filter_nodes(args: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], backend: Backend) -> dict[str, Any]:
    """ExtenderFilterResult: the candidates the pod fits on now; each other one with explain()'s words."""
    names, cache_mode = candidate_names(args)
    cluster = Cluster.build(args["Pod"], nodes, pods, backend)
    by_name = {n.name: n for n in cluster.inventory.nodes}
    fitting = fits_on(cluster.state, cluster.demand)
    fits = [n for n in names if n in by_name and fitting[cluster.state.names.index(n)]]
    failed = {}
    for name in names:
        if name not in by_name:
            failed[name] = "gpuslice does not know this node"
        elif name not in fits:
            failed[name] = str(explain(cluster.demand, Inventory([by_name[name]], cluster.inventory.backend)))
    answer: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": failed, "Error": ""}
    if cache_mode:
        answer["NodeNames"] = fits
    else:
        kept = set(fits)
        items = [n for n in (args.get("Nodes") or {}).get("items") or [] if n["metadata"]["name"] in kept]
        answer["Nodes"] = {**(args.get("Nodes") or {}), "items": items}
    return answer


def prioritize(
    args: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], backend: Backend, policy: str
) -> list[dict[str, Any]]:
    """HostPriorityList: the node the policy chooses among the candidates scores the most, the rest 0."""
    names, _ = candidate_names(args)
    decision = decide(Cluster.build(args["Pod"], nodes, pods, backend), names, policy)
    chosen = decision[0] if decision else None
    return [{"Host": n, "Score": MAX_PRIORITY if n == chosen else 0} for n in names]


def bind_annotations(
    pod: Obj, node: str, nodes: Sequence[Obj], pods: Iterable[Obj], backend: Backend, policy: str, now_ns: int
) -> dict[str, str]:
    """The device annotations for binding ``pod`` to ``node``: the cards our policy chooses
    there, written as the backend's device plugin reads them. Raises ExtenderError when
    the pod no longer fits there."""
    cluster = Cluster.build(pod, nodes, pods, backend)
    decision = decide(cluster, [node], policy)
    if decision is None:
        raise ExtenderError(f"{_key(pod)[1]} no longer fits on {node}: {explain(cluster.demand, cluster.inventory)}")
    _, choice = decision
    gpus = cluster.inventory.nodes[choice.node].gpus
    if backend is Backend.GPUSHARE and cluster.demand.is_slice:
        (index,) = choice.gpus
        return {
            GPUSHARE_IDX: str(index),
            GPUSHARE_POD: str(_limit(pod, GPUSHARE_RESOURCE)),
            GPUSHARE_DEV: str(_gpushare_per_card(next(n for n in nodes if n["metadata"]["name"] == node))),
            GPUSHARE_ASSIGNED: "false",
            GPUSHARE_ASSUME_TIME: str(now_ns),
        }
    if backend is Backend.HAMI and choice.gpus:
        taken = cluster.state.taken(choice, cluster.demand)
        cores = _limit(pod, HAMI_CORES)
        devices = "".join(
            f"{gpus[g].uuid},{HAMI_NVIDIA},{int(amount) // MiB},{cores}:"
            for g, amount in zip(choice.gpus, taken, strict=True)
        )
        value = devices + ";"  # one container asks for the devices (EncodePodSingleDevice)
        seconds = str(now_ns // 1_000_000_000)
        return {
            HAMI_TO_ALLOCATE: value,
            HAMI_ALLOCATED: value,
            HAMI_NODE: node,
            HAMI_TIME: seconds,
            HAMI_BIND_PHASE: "allocating",
            HAMI_BIND_TIME: seconds,
        }
    return {}


def _gpushare_per_card(node: Obj) -> int:
    """Memory per card in the device plugin's own unit, as gpushare's extender computes it
    (total / count of the node's capacity), so the unit (GiB or MiB) is whatever it reports."""
    status = node.get("status", {})
    capacity = status.get("capacity") or status.get("allocatable") or {}
    cards = int(capacity.get(GPUSHARE_COUNT, 0) or 0)
    return int(capacity.get(GPUSHARE_RESOURCE, 0) or 0) // cards if cards else 0


def binding(pod_name: str, pod_uid: str, node: str) -> dict[str, Any]:
    """The v1 Binding object that binds the pod (POST pods/{name}/binding)."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name, "uid": pod_uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
