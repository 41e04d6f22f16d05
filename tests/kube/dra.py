"""The API double's ``resource.k8s.io/v1`` group: its objects, the claim controller and the allocator.

What it serves and does, as Kubernetes 1.34+ does for the parts gpuslice uses:

- ResourceSlice and DeviceClass (cluster-scoped), ResourceClaim and ResourceClaimTemplate
  (namespaced): stored and served like any object (``RESOURCES``).
- The resourceclaim controller (kube-controller-manager): a pod's ``spec.resourceClaims`` entry with
  ``resourceClaimTemplateName`` gets a ResourceClaim made from the template, named
  ``<pod>-<claim>-<5 chars>``, owned by the pod, recorded in ``status.resourceClaimStatuses``
  (``claim_for``); the pod's deletion deletes it (ownerReference garbage collection).
- The scheduler's DRA plugin (``allocate``): for each request of each claim, the first device on the
  node, in the slices' order, that the DeviceClass's and the request's CEL selectors select and that is
  free: not allocated to any claim, or, with ``allowMultipleAllocations`` (DRAConsumableCapacity), with
  room for the request's ``capacity.requests`` (unrequested capacity consumes all of it). The claim's
  ``status.allocation`` records the devices (``consumedCapacity`` and a ``shareID`` for shared ones)
  and a node selector, ``status.reservedFor`` the pod. No device: the pod stays Pending with
  kube-scheduler's FitError in its PodScheduled condition and a FailedScheduling event
  (``unallocatable``): the plugin's Filter says ``cannot allocate all claims`` as
  UnschedulableAndUnresolvable, so DefaultPreemption finds preemption "not helpful" on every
  node, after the plugin's own PostFilter's ``still not schedulable``
  (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go; the message verbatim in
  kubernetes' test/integration/dra/dra_test.go, commit b94367ca).

CEL: only the subset the driver's DeviceClasses and gpuslice's templates use, ``&&`` of
``device.driver == '<s>'`` and ``device.attributes['<domain>'].<name> == '<s>'``; any other expression
is refused with an error naming it (the real API server accepts all of CEL). Allocation modes
ExactCount and All; no constraints (matchAttribute), no firstAvailable, no admin access.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from typing import Any

from spawner.shares import parse_quantity

Obj = dict[str, Any]
GROUP, VERSION = "resource.k8s.io", "v1"
# plural -> (kind, namespaced)
RESOURCES = {
    "resourceslices": ("ResourceSlice", False),
    "deviceclasses": ("DeviceClass", False),
    "resourceclaims": ("ResourceClaim", True),
    "resourceclaimtemplates": ("ResourceClaimTemplate", True),
}
UNALLOCATABLE = "cannot allocate all claims"


def unallocatable(nodes: int) -> tuple[str, str]:
    """kube-scheduler's FitError for a pod whose claims no node can allocate: (filter reasons, PostFilter's)."""
    preemption = f"preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling."
    return f"{nodes} {UNALLOCATABLE}", f"still not schedulable, {preemption}"


_COMPARISON = re.compile(
    r"^device\.(?:driver|attributes\['(?P<domain>[^']+)'\]\.(?P<name>[A-Za-z0-9_]+))\s*==\s*'(?P<value>[^']*)'$"
)


class UnsupportedCelError(ValueError):
    """A selector outside the subset the double evaluates."""


def cel_selects(expression: str, driver: str, device: Obj) -> bool:
    """Whether ``expression`` (the supported subset) selects ``device`` of ``driver``'s slice."""
    for term in (t.strip() for t in expression.split("&&")):
        found = _COMPARISON.match(term)
        if found is None:
            raise UnsupportedCelError(f"the API double evaluates no CEL like {term!r} (in {expression!r})")
        if found.group("name") is None:
            actual = driver
        else:
            if found.group("domain") != driver:
                return False  # another driver's attribute: absent, so the comparison is false
            attribute = (device.get("attributes") or {}).get(found.group("name")) or {}
            actual = str(next(iter(attribute.values()), ""))
        if actual != found.group("value"):
            return False
    return True


def claim_for(pod: Obj, pod_claim: Obj, template: Obj) -> Obj:
    """The ResourceClaim the resourceclaim controller makes from ``template`` for ``pod``."""
    meta = pod["metadata"]
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{meta['name']}-{pod_claim['name']}-{suffix}",
            "namespace": meta["namespace"],
            "annotations": {"resource.kubernetes.io/pod-claim-name": pod_claim["name"]},
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": dict(template["spec"]["spec"]),
        "status": {},
    }


def _devices(slices: list[Obj], node: str) -> list[tuple[str, str, Obj]]:
    """(driver, pool, device) on ``node``, the newest generation of each pool, in the slices' order."""
    newest: dict[str, int] = {}
    for item in slices:
        pool = item["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), int(pool.get("generation", 0)))
    found = []
    for item in slices:
        spec = item["spec"]
        if spec.get("nodeName") != node or int(spec["pool"].get("generation", 0)) < newest[spec["pool"]["name"]]:
            continue
        found += [(spec["driver"], spec["pool"]["name"], d) for d in spec.get("devices") or []]
    return found


def _consumed(claims: list[Obj]) -> tuple[set[tuple[str, str, str]], dict[tuple[str, str, str], dict[str, int]]]:
    """Devices allocated whole, and the capacity consumed of shared ones, by (driver, pool, device)."""
    whole: set[tuple[str, str, str]] = set()
    shared: dict[tuple[str, str, str], dict[str, int]] = {}
    for claim in claims:
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
            key = (result["driver"], result["pool"], result["device"])
            if result.get("consumedCapacity"):
                used = shared.setdefault(key, {})
                for name, amount in result["consumedCapacity"].items():
                    used[name] = used.get(name, 0) + parse_quantity(str(amount))
            else:
                whole.add(key)
    return whole, shared


def allocate(claim: Obj, node: str, slices: list[Obj], classes: dict[str, Obj], claims: list[Obj]) -> list[Obj] | None:
    """The claim's ``status.allocation.devices.results`` on ``node`` (None: it cannot be allocated there)."""
    whole, shared = _consumed(claims)
    devices = _devices(slices, node)
    results: list[Obj] = []
    for request in claim["spec"]["devices"]["requests"]:
        exactly = request.get("exactly") or {}
        device_class = classes.get(exactly.get("deviceClassName", ""))
        if device_class is None:
            return None
        selectors = [*(device_class.get("spec", {}).get("selectors") or []), *(exactly.get("selectors") or [])]
        wanted = {k: parse_quantity(str(v)) for k, v in ((exactly.get("capacity") or {}).get("requests") or {}).items()}
        count = None if exactly.get("allocationMode") == "All" else int(exactly.get("count", 1))
        chosen = []
        for driver, pool, device in devices:
            key = (driver, pool, device["name"])
            if key in whole or not all(cel_selects(s["cel"]["expression"], driver, device) for s in selectors):
                continue
            capacity = {k: parse_quantity(str(v["value"])) for k, v in (device.get("capacity") or {}).items()}
            if any(capacity.get(k, 0) < v for k, v in wanted.items()):
                continue
            result: Obj = {"request": request["name"], "driver": driver, "pool": pool, "device": device["name"]}
            if device.get("allowMultipleAllocations"):
                consume = {k: wanted.get(k, v) for k, v in capacity.items()}  # unrequested: all of it
                used = shared.get(key, {})
                if any(used.get(k, 0) + v > capacity[k] for k, v in consume.items()):
                    continue
                shared[key] = {k: used.get(k, 0) + v for k, v in consume.items()}
                result["consumedCapacity"] = {k: str(v) for k, v in consume.items()}
                result["shareID"] = str(uuid.uuid4())
            elif key in shared:
                continue  # shared already: no claim may take it whole
            else:
                whole.add(key)
            chosen.append(result)
            if count is not None and len(chosen) == count:
                break
        if (count is not None and len(chosen) < count) or not chosen:
            return None
        results += chosen
    return results


def allocation(results: list[Obj], node: str) -> Obj:
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": terms}}
