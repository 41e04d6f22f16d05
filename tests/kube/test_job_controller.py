"""The API double's Job controller against the behaviour of Kubernetes' own (tests/kube/job_controller.py says
where each rule comes from): pods owned by their Job, retries up to backoffLimit after the pod-failure backoff,
the active deadline, the Complete and Failed conditions, and a finished Job's TTL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.kube.test_apiserver import Double, eventually, run

Obj = dict[str, Any]


def job(name: str, script: str, **spec: Any) -> Obj:
    container = {"name": "main", "image": "busybox:1.36", "command": ["/bin/sh", "-c", script]}
    template = {"spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1}}
    return {"metadata": {"name": name}, "spec": {"template": template, **spec}}


async def conditions(double: Double, name: str) -> dict[str, tuple[str, str]]:
    found = await double.batch.read_namespaced_job(name, "team")
    return {c.type: (c.reason or "", c.message or "") for c in found.status.conditions or [] if c.status == "True"}


async def pods_of(double: Double, name: str) -> list[Any]:
    return (await double.core.list_namespaced_pod("team", label_selector=f"job-name={name}")).items


def test_a_job_runs_its_pod_retries_it_up_to_its_backoff_limit_and_keeps_to_its_deadline() -> None:
    async def check(double: Double) -> None:
        await double.batch.create_namespaced_job("team", job("ok", "echo done", ttlSecondsAfterFinished=2))
        await double.batch.create_namespaced_job("team", job("flaky", "echo try; exit 3", backoffLimit=1))
        await double.batch.create_namespaced_job("team", job("slow", "sleep 60", activeDeadlineSeconds=2))

        async def complete() -> bool:
            return "Complete" in await conditions(double, "ok")

        await eventually(complete, "the Job completes")
        done = await double.batch.read_namespaced_job("ok", "team")
        assert done.status.succeeded == 1 and done.status.completion_time is not None
        assert "SuccessCriteriaMet" in await conditions(double, "ok")  # first, as since 1.31
        (only,) = await pods_of(double, "ok")
        owner = only.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.controller, owner.block_owner_deletion) == ("Job", "ok", True, True)
        assert only.metadata.name.startswith("ok-") and only.status.phase == "Succeeded"
        assert "done" in await double.core.read_namespaced_pod_log(only.metadata.name, "team")

        async def past_deadline() -> bool:
            return "Failed" in await conditions(double, "slow")

        await eventually(past_deadline, "the deadline fails the Job")
        assert (await conditions(double, "slow"))["Failed"] == (
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        )
        assert all(p.metadata.deletion_timestamp or p.status.phase == "Failed" for p in await pods_of(double, "slow"))

        async def two_failures() -> bool:
            return "Failed" in await conditions(double, "flaky")

        await until(two_failures, "the backoff limit fails the Job", 60)
        failed = await double.batch.read_namespaced_job("flaky", "team")
        assert failed.status.failed == 2 and (await conditions(double, "flaky"))["Failed"][0] == "BackoffLimitExceeded"
        first, retry = sorted(await pods_of(double, "flaky"), key=lambda p: p.metadata.creation_timestamp)
        waited = (retry.metadata.creation_timestamp - first.metadata.creation_timestamp).total_seconds()
        assert waited >= 9  # the pod-failure backoff, 10 s (timestamps are whole seconds)

        async def expired() -> bool:
            return "ok" not in [j.metadata.name for j in (await double.batch.list_namespaced_job("team")).items]

        await eventually(expired, "the TTL deletes the finished Job")
        await eventually(lambda: _none(pods_of(double, "ok")), "its pods go with it")

        await double.batch.delete_namespaced_job("slow", "team", propagation_policy="Background")
        await eventually(lambda: _none(pods_of(double, "slow")), "a deleted Job's pods are collected")

    run(check, kubelet=True)


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def _none(found: Any) -> bool:
    return not await found
