"""The API double's KAI Scheduler: its Queue objects (``scheduling.run.ai/v2``) and how it places a fraction.

As NVIDIA/KAI-Scheduler (commit 72de64fc8eca10fa8cca26a20156178f3edbe092) does for the pods gpuslice
makes, and no more: a pod with ``schedulerName: kai-scheduler`` must name an existing leaf queue in
``kai.scheduler/queue``; a fraction (``gpu-memory`` MiB or ``gpu-fraction``) goes to the GPU group
with the least room that holds it (KAI's default binpack), else to a card nothing holds, for which the
binder makes a reservation pod (``gpu-reservation-<node>-<5 chars>`` in ``kai-resource-reservation``,
labels ``app`` and ``runai-gpu-group``, one ``nvidia.com/gpu``; the card's UUID in
``run.ai/reserve_for_gpu_index``, pkg/binder/binding/resourcereservation/resource_reservation.go); the
pod gets the group's label and ``received-resource-type: Fraction`` and is bound. Nothing fits: the pod
stays Pending, its condition and event in KAI's words (pkg/scheduler/api/common_info/pod_errors.go:
``node(s) didn't have enough resources: GPUs``). Not modelled: queue quotas, fairness, reclaim and
preemption, gangs, whole-card pods beyond a count check.

Each Queue's status is kept as KAI's pod-group and queue controllers keep it (``queue_statuses``), after
every placement, refusal, pod removal and queue creation: ``requested`` sums the queue's Pending and
Running pods (``gpu-fraction`` as ``nvidia.com/gpu``, ``gpu-memory`` as ``run.ai/gpu.memory`` in MiB,
whole cards as ``nvidia.com/gpu``), ``allocated`` its bound ones (a fraction as its share of the card:
``gpu-memory`` over the node's ``nvidia.com/gpu.memory``, rounded up to nano as resource.Quantity
parses it), a parent the sums of its children, listed in ``childQueues``; the values written as
resource.Quantity writes them ("250m"). pkg/podgroupcontroller/controllers/metadata/pod.go and
resources/{requested,received,fraction}.go, pkg/queuecontroller/controllers/resource_updater and
childqueues_updater. Only the GPU entries: KAI also sums the containers' CPU and memory requests there,
which gpuslice does not read.
"""

from __future__ import annotations

import random
import string
import uuid
from decimal import ROUND_UP, Decimal
from typing import Any

Obj = dict[str, Any]
GROUP, VERSION = "scheduling.run.ai", "v2"
RESOURCES = {"queues": ("Queue", False)}
SCHEDULER = "kai-scheduler"
QUEUE_LABEL = "kai.scheduler/queue"
GPU_GROUP = "runai-gpu-group"
RESERVATION_NAMESPACE = "kai-resource-reservation"
RESERVED_UUID = "run.ai/reserve_for_gpu_index"
GPU = "nvidia.com/gpu"
REQUESTED_MEMORY = "run.ai/gpu.memory"
NANO = Decimal("1e-9")
SUFFIXES = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, ""), (-3, "m"), (-6, "u"), (-9, "n"))
MiB = 2**20


def wanted_mib(pod: Obj, card_mib: int) -> int:
    annotations = pod["metadata"].get("annotations") or {}
    if annotations.get("gpu-memory"):
        return int(annotations["gpu-memory"])
    return int(float(annotations.get("gpu-fraction", 0) or 0) * card_mib)


def is_fraction(pod: Obj) -> bool:
    annotations = pod["metadata"].get("annotations") or {}
    return bool(annotations.get("gpu-memory") or annotations.get("gpu-fraction"))


def card_uuid(node: str, index: int) -> str:
    """The simulated card's UUID (the reservation pod reads the real one from NVML)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}"


def place(pod: Obj, nodes: list[Obj], pods: list[Obj]) -> tuple[str, str, Obj | None] | str:
    """(node, GPU group, a new reservation pod or None) for a fraction, or KAI's reason it cannot go anywhere."""
    short = 0
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        cards = int((node.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0) or 0)
        card_mib = int(labels.get("nvidia.com/gpu.memory", 0) or 0)
        asked = wanted_mib(pod, card_mib)
        on_node = [
            p
            for p in pods
            if p["spec"].get("nodeName") == name and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        groups = {
            (p["metadata"].get("labels") or {}).get(GPU_GROUP)
            for p in on_node
            if p["metadata"].get("namespace") == RESERVATION_NAMESPACE
        }
        used = {g: 0 for g in groups if g}
        for other in on_node:
            group = (other["metadata"].get("labels") or {}).get(GPU_GROUP)
            if group in used and other["metadata"].get("namespace") != RESERVATION_NAMESPACE:
                used[group] += wanted_mib(other, card_mib)
        fitting = [g for g, u in used.items() if card_mib - u >= asked]
        if fitting:
            return name, min(fitting, key=lambda g: (card_mib - used[g], g)), None
        whole = sum(
            int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
            for p in on_node
            for c in p["spec"].get("containers") or []
        )
        if whole < cards and asked <= card_mib:
            group = str(uuid.uuid4())
            return name, group, reservation_pod(name, group, card_uuid(name, whole))
        short += 1
    return f"0/{len(nodes)} nodes are available: {short} node(s) didn't have enough resources: GPUs."


def reservation_pod(node: str, group: str, card: str) -> Obj:
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"gpu-reservation-{node}-{suffix}",
            "namespace": RESERVATION_NAMESPACE,
            "labels": {"app": "kai-resource-reservation", GPU_GROUP: group},
            "annotations": {"karpenter.sh/do-not-disrupt": "true", RESERVED_UUID: card},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "resource-reservation",
                    "image": "ghcr.io/nvidia/kai-scheduler/resource-reservation",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def queue_problem(pod: Obj, queues: list[Obj]) -> str:
    """Why KAI would not take the pod's queue ("" if it is a leaf queue that exists)."""
    name = (pod["metadata"].get("labels") or {}).get(QUEUE_LABEL, "")
    known = {q["metadata"]["name"] for q in queues}
    parents = {(q.get("spec") or {}).get("parentQueue") for q in queues}
    if not name:
        return f"the pod names no queue (label {QUEUE_LABEL})"
    if name not in known:
        return f"queue {name} does not exist"
    if name in parents:
        return f"queue {name} is not a leaf queue"
    return ""


def queue_statuses(queues: list[Obj], pods: list[Obj], nodes: list[Obj]) -> dict[str, Obj]:
    """Each queue's ``status`` (GPU entries) as KAI's controllers write it from its pods and child queues."""
    card_mib = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.memory") for n in nodes}
    own: dict[str, tuple[dict[str, Decimal], dict[str, Decimal]]] = {}
    for pod in pods:
        name = (pod["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if name and pod["status"].get("phase") in ("Pending", "Running"):
            requested, allocated = own.setdefault(name, ({}, {}))
            _add(requested, _requested(pod))
            if pod["status"].get("phase") == "Running" or _scheduled(pod):
                _add(allocated, _allocated(pod, card_mib.get(pod["spec"].get("nodeName", ""))))
    children = {q["metadata"]["name"]: [] for q in queues}
    for queue in queues:
        parent = (queue.get("spec") or {}).get("parentQueue")
        if parent in children:
            children[parent].append(queue["metadata"]["name"])

    def sums(name: str) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
        requested, allocated = ({**own.get(name, ({}, {}))[0]}, {**own.get(name, ({}, {}))[1]})
        for child in children.get(name, []):
            more = sums(child)
            _add(requested, more[0])
            _add(allocated, more[1])
        return requested, allocated

    statuses = {}
    for name in children:
        requested, allocated = sums(name)
        status: Obj = {}
        if allocated:
            status["allocated"] = {k: quantity(v) for k, v in sorted(allocated.items())}
        if requested:
            status["requested"] = {k: quantity(v) for k, v in sorted(requested.items())}
        if children[name]:
            status["childQueues"] = sorted(children[name])
        statuses[name] = status
    return statuses


def quantity(value: Decimal) -> str:
    """As resource.Quantity writes a decimal amount: no fraction, the largest suffix that allows it."""
    if value == 0:
        return "0"
    for exponent, suffix in SUFFIXES:
        scaled = value.scaleb(-exponent)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    raise ValueError(f"{value} is finer than a nano")  # parsed amounts are rounded up to nano


def _parsed(text: str) -> Decimal:
    """resource.MustParse of a plain decimal: an amount finer than nano is rounded up to nano."""
    return Decimal(text).quantize(NANO, rounding=ROUND_UP)


def _requested(pod: Obj) -> dict[str, Decimal]:
    annotations = pod["metadata"].get("annotations") or {}
    found = {GPU: Decimal(_cards(pod))} if _cards(pod) else {}
    if annotations.get("gpu-fraction"):
        found[GPU] = found.get(GPU, Decimal(0)) + _parsed(annotations["gpu-fraction"])
    if annotations.get("gpu-memory"):
        found[REQUESTED_MEMORY] = _parsed(annotations["gpu-memory"])
    return found


def _allocated(pod: Obj, node_card_mib: str | None) -> dict[str, Decimal]:
    annotations = pod["metadata"].get("annotations") or {}
    share = Decimal(_cards(pod))
    if annotations.get("received-resource-type") == "Fraction":
        if annotations.get("gpu-fraction"):
            share += _parsed(annotations["gpu-fraction"])
        elif annotations.get("gpu-memory") and node_card_mib:
            share += _parsed(repr(int(annotations["gpu-memory"]) / float(node_card_mib)))  # FormatFloat(.., 'f', -1)
    return {GPU: share} if share else {}


def _cards(pod: Obj) -> int:
    """Whole cards the containers request (requests default to the limits for extended resources)."""
    total = 0
    for container in pod["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(GPU) or 0
        total += int(amount)
    return total


def _scheduled(pod: Obj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in pod["status"].get("conditions") or []
    )


def _add(into: dict[str, Decimal], more: dict[str, Decimal]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, Decimal(0)) + value
