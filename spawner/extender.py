"""kube-scheduler extender decisions: filter, prioritize and bind by our placement policy.

Pure code: every function takes the cluster's Node and Pod objects (API JSON as dicts)
and answers in the shapes of k8s.io/kube-scheduler/extender/v1, whose Go structs have
no JSON tags, so the keys are the Go field names (``Pod``, ``Nodes``, ``NodeNames``,
``FailedNodes``, ``Host``, ``Score``, ...), matched as Go's encoding/json matches them: an
exact key first, else any key equal to it but for case (``decode``; the types' own test,
extender/v1/types_test.go, checks that lowercased bodies decode). ``Nodes`` and
``NodeNames`` are pointers: the scheduler sends one of them (``NodeNames`` when the
extender is ``nodeCacheCapable``) and the answer fills the same one and leaves the other
null. A node the pod cannot fit on even were it empty (too small, the wrong model, unknown)
is ``FailedAndUnresolvableNodes``: preempting pods there would not help; a node that is
only full is ``FailedNodes``.

On bind the pod gets the annotations the backend's device plugin reads to pick the card
(each backend's ``bind_annotations`` in spawner/sharing/: gpushare's ``ALIYUN_COM_GPU_MEM_*``,
HAMi's ``hami.io/vgpu-devices-to-allocate`` and friends). The I/O (reading the cluster,
patching and binding the pod) is hub/extender.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spawner.inventory import Inventory, cpu_milli, holds_resources, memory_bytes
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
from spawner.sharing import SharingBackend, read
from spawner.sharing.base import GFD_PRODUCT, Listing, containers

Obj = Mapping[str, Any]
MAX_PRIORITY = 10  # extender/v1 MaxExtenderPriority


class ExtenderError(ValueError):
    """A request the extender cannot serve; the message goes back in the answer's Error."""


def pod_demand(pod: Obj, sharing: SharingBackend) -> Demand:
    """What a pod asks of a node: CPU and memory requests, and its GPU resources as the
    backend's device plugin reads them; a ``nvidia.com/gpu.product`` node selector binds
    it to that model."""
    cpu = memory = 0
    for container in containers(pod):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        cpu += cpu_milli(asked.get("cpu", 0))
        memory += memory_bytes(asked.get("memory", 0))
    product = (pod.get("spec", {}).get("nodeSelector") or {}).get(GFD_PRODUCT)
    base = Demand(cpu_milli=cpu, memory_bytes=memory, models=frozenset({product}) if product else None)
    return sharing.gpu_demand(pod, base)


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
    sharing: SharingBackend  # fitted to the cluster (gpushare's unit inferred from its nodes)

    @classmethod
    def build(cls, pod: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], sharing: SharingBackend) -> Cluster:
        others = [p for p in pods if _key(p) != _key(pod)]
        fitted, inventory = read(sharing, Listing(nodes, others))
        demand = pod_demand(pod, fitted)
        workload = seen_workload(others, fitted, demand)
        return cls(inventory, ClusterState.from_inventory(inventory), workload, demand, fitted)

    def only(self, names: Iterable[str]) -> ClusterState:
        """The state with every node outside ``names`` taking nothing."""
        keep = set(names)
        state = ClusterState.from_inventory(self.inventory)
        state.node_ok &= np.array([n in keep for n in state.names], dtype=bool)
        return state


def seen_workload(pods: Iterable[Obj], sharing: SharingBackend, demand: Demand) -> Workload:
    """The target workload: what the policy knows live (``known_workload``, the code the benchmark
    replays), the pods arrived so far, placed or still pending (a pod no node could take waits,
    and is seen), and the one being placed. Finished pods have left. CPU-only pods count, as the
    trace's workload includes them."""
    return known_workload(arrived_counts(pod_demand(p, sharing) for p in pods if holds_resources(p)), demand)


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


ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")  # extender/v1 ExtenderArgs
BINDING_FIELDS = ("PodName", "PodNamespace", "PodUID", "Node")  # extender/v1 ExtenderBindingArgs


def decode(body: Any, fields: Sequence[str]) -> dict[str, Any]:
    """A JSON object read into a Go struct of these fields, as encoding/json reads it: each field
    from the key that equals its name, else from a key equal to it but for case; other keys
    ignored; a missing field is null. Raises ExtenderError when the body is no object."""
    if not isinstance(body, Mapping):
        raise ExtenderError(f"json: cannot unmarshal {type(body).__name__} into the extender's arguments")
    decoded: dict[str, Any] = {}
    for name in fields:
        key = name if name in body else next((k for k in body if k.lower() == name.lower()), None)
        decoded[name] = body[key] if key is not None else None
    return decoded


def candidate_names(args: Obj) -> tuple[list[str], bool]:
    """The candidate node names, and whether they came as NodeNames (cache mode)."""
    if args.get("NodeNames") is not None:
        return list(args["NodeNames"]), True
    nodes = args.get("Nodes") or {}
    return [n["metadata"]["name"] for n in nodes.get("items") or []], False


def fits_when_empty(node: Obj, demand: Demand, sharing: SharingBackend) -> bool:
    """Whether the demand would fit on the node with no pod on it (else preemption cannot help)."""
    return bool(fits_on(ClusterState.from_inventory(sharing.read_cluster(Listing([node], []))), demand).any())


def filter_nodes(args: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], sharing: SharingBackend) -> dict[str, Any]:
    """ExtenderFilterResult: the candidates the pod fits on now; each other one with explain()'s words,
    in FailedAndUnresolvableNodes when it could not hold the pod even were it empty."""
    args = decode(args, ARGS_FIELDS)
    if not isinstance(args["Pod"], Mapping):
        raise ExtenderError("the arguments name no Pod")
    names, cache_mode = candidate_names(args)
    cluster = Cluster.build(args["Pod"], nodes, pods, sharing)
    if not asks_for_a_gpu(cluster.demand):
        # Not the extender's to judge: kube-scheduler's own filters weighed its CPU and memory (with the
        # extender's managedResources set, such a pod is not even sent here).
        return _filtered(args, cache_mode, names, {}, {})
    by_name = {n.name: n for n in cluster.inventory.nodes}
    objects = {n["metadata"]["name"]: n for n in nodes}
    fitting = fits_on(cluster.state, cluster.demand)
    fits = [n for n in names if n in by_name and fitting[cluster.state.names.index(n)]]
    failed, unresolvable = {}, {}
    for name in names:
        if name not in by_name:
            unresolvable[name] = "gpuslice does not know this node"
        elif name not in fits:
            why = str(explain(cluster.demand, Inventory([by_name[name]], cluster.inventory.backend)))
            if fits_when_empty(objects[name], cluster.demand, cluster.sharing):
                failed[name] = why
            else:
                unresolvable[name] = why
    return _filtered(args, cache_mode, fits, failed, unresolvable)


def asks_for_a_gpu(demand: Demand) -> bool:
    return demand.gpus > 0 or bool(demand.slice_units) or bool(demand.slice_fraction)


def _filtered(args: Obj, cache_mode: bool, fits: list[str], failed: Obj, unresolvable: Obj) -> dict[str, Any]:
    """ExtenderFilterResult in the form the candidates came in: names, or the node objects as sent."""
    answer: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if cache_mode:
        answer["NodeNames"] = fits
    else:
        kept = set(fits)
        items = [n for n in (args.get("Nodes") or {}).get("items") or [] if n["metadata"]["name"] in kept]
        answer["Nodes"] = {**(args.get("Nodes") or {}), "items": items}
    return answer


def prioritize(
    args: Obj, nodes: Sequence[Obj], pods: Iterable[Obj], sharing: SharingBackend, policy: str
) -> list[dict[str, Any]]:
    """HostPriorityList: the node the policy chooses among the candidates scores the most, the rest 0."""
    args = decode(args, ARGS_FIELDS)
    if not isinstance(args["Pod"], Mapping):
        raise ExtenderError("the arguments name no Pod")
    names, _ = candidate_names(args)
    decision = decide(Cluster.build(args["Pod"], nodes, pods, sharing), names, policy)
    chosen = decision[0] if decision else None
    return [{"Host": n, "Score": MAX_PRIORITY if n == chosen else 0} for n in names]


def bind_annotations(
    pod: Obj, node: str, nodes: Sequence[Obj], pods: Iterable[Obj], sharing: SharingBackend, policy: str, now_ns: int
) -> dict[str, str]:
    """The device annotations for binding ``pod`` to ``node``: the cards our policy chooses
    there, written as the backend's device plugin reads them. Raises ExtenderError when
    the pod no longer fits there."""
    cluster = Cluster.build(pod, nodes, pods, sharing)
    decision = decide(cluster, [node], policy)
    if decision is None:
        raise ExtenderError(f"{_key(pod)[1]} no longer fits on {node}: {explain(cluster.demand, cluster.inventory)}")
    _, choice = decision
    gpus = cluster.inventory.nodes[choice.node].gpus
    chosen = [gpus[g] for g in choice.gpus]
    taken = [float(t) for t in cluster.state.taken(choice, cluster.demand)] if choice.gpus else []
    node_obj = next(n for n in nodes if n["metadata"]["name"] == node)
    return cluster.sharing.bind_annotations(pod, node_obj, chosen, taken, now_ns)


def binding(pod_name: str, pod_uid: str, node: str) -> dict[str, Any]:
    """The v1 Binding object that binds the pod (POST pods/{name}/binding)."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name, "uid": pod_uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
