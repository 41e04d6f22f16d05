"""The memory and CPU a job is planned with (pure: no spawner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spawner.job_request import JobPlace, job_resources
from spawner.jobs import JobSpec
from spawner.request import GpuRefused
from spawner.shares import GiB


def spec(**more: object) -> JobSpec:
    return JobSpec.model_validate({"command": ["python", "train.py"], **more})


def test_on_kubernetes_a_job_that_asks_for_nothing_gets_its_classs_memory_and_cpu_limits() -> None:
    """Nothing else limits a job's pod: without them it could take its node's memory and cores."""
    kube = JobPlace(
        "ghcr.io/x/lab", Path("/home/jovyan"), "", 4 * GiB, sees_home=False, cpu_limit=2.0, limits_in_plan=True
    )
    assert job_resources(spec(), kube, 64) == (4 * GiB, 2.0)
    assert job_resources(spec(memory="1GiB", cpus=0.5), kube, 64) == (GiB, 0.5)
    with pytest.raises(GpuRefused, match="up to 4 GiB of memory"):
        job_resources(spec(memory="8GiB"), kube, 64)


def test_on_one_machine_the_plan_leaves_the_limits_to_the_jobs_cgroup() -> None:
    """Its cgroup takes the class's limits when it starts (spawner/job_launch.py): the plan keeps what was asked."""
    local = JobPlace(".venv", Path("/home/ann"), "jupyter-ann", 4 * GiB)
    assert job_resources(spec(), local, 8) == (None, None)
    with pytest.raises(GpuRefused, match="8 CPU cores"):
        job_resources(spec(cpus=16), local, 8)
