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
"""

from __future__ import annotations

import random
import string
import uuid
from typing import Any

Obj = dict[str, Any]
GROUP, VERSION = "scheduling.run.ai", "v2"
RESOURCES = {"queues": ("Queue", False)}
SCHEDULER = "kai-scheduler"
QUEUE_LABEL = "kai.scheduler/queue"
GPU_GROUP = "runai-gpu-group"
RESERVATION_NAMESPACE = "kai-resource-reservation"
RESERVED_UUID = "run.ai/reserve_for_gpu_index"
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
