"""The API double's scheduling of the named groups beside core/v1: ``resource.k8s.io/v1``
(tests/kube/dra.py) and KAI's ``scheduling.run.ai/v2`` (tests/kube/kai.py).

Their objects are served, as ``<plural>.<group>``, by the double's REST layer like any other group's
(tests/kube/api/registry.py lists them). This mixin of ``ApiServer`` is asked first in ``_schedule``: a
pod with ``spec.resourceClaims`` gets its claims made and allocated before it is bound (or stays Pending
with kube-scheduler's words); a pod for ``kai-scheduler`` (when that scheduler runs:
``--schedulers ...,kai-scheduler``) is placed as KAI places a fraction, and KAI's queues' statuses follow
its pods (``account_queues``: after a placement or refusal, a pod's removal, a queue's creation). A claim
made for a pod is owned by it (ownerReferences) and goes with it by the garbage collector.
"""

from __future__ import annotations

from typing import Any

from tests.kube import dra, kai

Obj = dict[str, Any]


class GroupsMixin:
    """Needs ``self.store`` (put, items, objects), ``_place``, ``_unschedulable``, ``_event``,
    ``schedulers``: ApiServer's."""

    store: Any

    # -- scheduling ---------------------------------------------------------------------

    async def schedule_in_groups(self, pod: Obj, nodes: list[Obj]) -> bool:
        """Schedule ``pod`` if it is these groups' to schedule (True: done here, placed or left Pending)."""
        if pod["spec"].get("schedulerName") == kai.SCHEDULER:
            if kai.SCHEDULER in self.schedulers:  # type: ignore[attr-defined]
                await self._schedule_kai(pod, nodes)
            return True
        if pod["spec"].get("resourceClaims"):
            await self._schedule_dra(pod, nodes)
            return True
        return False

    async def _schedule_dra(self, pod: Obj, nodes: list[Obj]) -> None:
        claims = []
        namespace = pod["metadata"]["namespace"]
        statuses = []
        for pod_claim in pod["spec"]["resourceClaims"]:
            template_name = pod_claim.get("resourceClaimTemplateName")
            if not template_name:
                claim = self.store.objects.get(
                    ("resourceclaims.resource.k8s.io", namespace, pod_claim.get("resourceClaimName"))
                )
            else:
                template = self.store.objects.get(("resourceclaimtemplates.resource.k8s.io", namespace, template_name))
                if template is None:
                    message = f'resourceclaimtemplate.resource.k8s.io "{template_name}" not found'
                    await self._event(pod, "Warning", "FailedResourceClaimCreation", message)  # type: ignore[attr-defined]
                    await self._unschedulable(pod, len(nodes), f"{len(nodes)} {message}")  # type: ignore[attr-defined]
                    return
                claim = dra.claim_for(pod, pod_claim, template)
                await self.store.put("resourceclaims.resource.k8s.io", namespace, claim, "ADDED")
                statuses.append({"name": pod_claim["name"], "resourceClaimName": claim["metadata"]["name"]})
            if claim is None:
                await self._unschedulable(pod, len(nodes), f"{len(nodes)} resourceclaim not found")  # type: ignore[attr-defined]
                return
            claims.append(claim)
        if statuses:
            pod["status"]["resourceClaimStatuses"] = statuses
        slices = self.store.items("resourceslices.resource.k8s.io", None)
        classes = {c["metadata"]["name"]: c for c in self.store.items("deviceclasses.resource.k8s.io", None)}
        for node in nodes:
            name = node["metadata"]["name"]
            others = [c for c in self.store.items("resourceclaims.resource.k8s.io", None) if c not in claims]
            results = []
            for claim in claims:
                found = dra.allocate(claim, name, slices, classes, others)
                if found is None:
                    break
                results.append(found)
                others.append({"status": {"allocation": dra.allocation(found, name)}})
            else:
                for claim, found in zip(claims, results, strict=True):
                    reserved = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
                    claim["status"] = {"allocation": dra.allocation(found, name), "reservedFor": [reserved]}
                    await self.store.put("resourceclaims.resource.k8s.io", namespace, claim, "MODIFIED")
                await self._place(pod, name)  # type: ignore[attr-defined]
                return
        await self._unschedulable(pod, len(nodes), *dra.unallocatable(len(nodes)))  # type: ignore[attr-defined]

    async def _schedule_kai(self, pod: Obj, nodes: list[Obj]) -> None:
        await self._place_with_kai(pod, nodes)
        await self.account_queues()

    async def _place_with_kai(self, pod: Obj, nodes: list[Obj]) -> None:
        problem = kai.queue_problem(pod, self.store.items("queues.scheduling.run.ai", None))
        if problem:
            await self._kai_unschedulable(pod, problem)
            return
        if not kai.is_fraction(pod):
            await self._place(pod, nodes[0]["metadata"]["name"])  # type: ignore[attr-defined]
            return
        placed = kai.place(pod, nodes, self.store.items("pods", None))
        if isinstance(placed, str):
            await self._kai_unschedulable(pod, placed)
            return
        node, group, reservation = placed
        if reservation is not None:
            reservation["status"] = {"phase": "Running"}
            await self.store.put("pods", kai.RESERVATION_NAMESPACE, reservation, "ADDED")
        pod["metadata"].setdefault("labels", {})[kai.GPU_GROUP] = group
        pod["metadata"].setdefault("annotations", {})["received-resource-type"] = "Fraction"
        await self._place(pod, node)  # type: ignore[attr-defined]

    async def _kai_unschedulable(self, pod: Obj, message: str) -> None:
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ]
        await self.store.put("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
        await self._event(pod, "Warning", "Unschedulable", message)  # type: ignore[attr-defined]

    async def account_queues(self, _changed: Obj | None = None) -> None:
        """KAI's pod-group and queue controllers: each Queue's status from its pods and child queues."""
        queues = self.store.items("queues.scheduling.run.ai", None)
        statuses = kai.queue_statuses(queues, self.store.items("pods", None), self.store.items("nodes", None))
        for queue in queues:
            if queue.get("status", {}) != statuses[queue["metadata"]["name"]]:
                queue["status"] = statuses[queue["metadata"]["name"]]
                await self.store.put("queues.scheduling.run.ai", "", queue, "MODIFIED")
