"""A job as a batch/v1 Job, and a Job read back, from literal objects."""

from spawner.job_kube import JobPod, job_manifest, job_name, observed
from spawner.jobs import FAILED, RUNNING, STARTING, SUCCEEDED, TIME_LIMIT
from spawner.shares import GiB, GpuRequest
from spawner.sharing import backend
from spawner.sharing.base import Target


def manifest(**changes: object) -> dict:  # type: ignore[type-arg]
    gpu = backend("gpushare").render(GpuRequest(memory_bytes=4 * GiB), Target(card_bytes=16 * GiB, group="ml"))
    args = {
        "name": job_name(12, 2),
        "job_id": 12,
        "user": "ann",
        "group": "ml",
        "asked_bytes": 4 * GiB,
        "image": "ghcr.io/gpuslice/pytorch:2.5.1",
        "command": ["python", "train.py"],
        "env": {"SEED": "1", "GPUSLICE_JOB_ID": "12"},
        "gpu": gpu,
        "holds_gpu": True,
        "retries": 2,
        "time_limit_s": 7200,
        "cpus": 2.0,
        "memory_bytes": 8 * GiB,
        "models": {"langid-97": "langid"},
        "pod": JobPod("team", "gpuslice-scheduler", models_volume={"persistentVolumeClaim": {"claimName": "m"}}),
        **changes,
    }
    return job_manifest(**args)  # type: ignore[arg-type]


def test_a_job_is_a_job_with_the_jobs_retries_deadline_and_the_backends_pod() -> None:
    job = manifest()
    assert job["metadata"] == {
        "name": "gpuslice-job-12-2",
        "namespace": "team",
        "labels": {
            "app.kubernetes.io/managed-by": "gpuslice",
            "app.kubernetes.io/component": "batch-job",
            "gpuslice.io/job": "12",
            "hub.jupyter.org/username": "ann",
        },
    }
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (2, 7200, 86400)
    pod = spec["template"]
    assert pod["metadata"]["annotations"]["hub.jupyter.org/servername"] == "job:12"  # the line's key: ann/job:12
    assert pod["metadata"]["annotations"]["gpuslice.io/group"] == "ml"
    assert pod["metadata"]["annotations"]["gpuslice.io/gpu-memory-bytes"] == str(4 * GiB)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"aliyun.com/gpu-mem": "4", "cpu": "2000m", "memory": str(8 * GiB)}
    assert {"name": "SEED", "value": "1"} in container["env"]
    assert container["volumeMounts"] == [
        {"name": "gpuslice-models", "mountPath": "/models/langid-97", "subPath": "langid", "readOnly": True}
    ]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["schedulerName"] == "gpuslice-scheduler"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30  # the checkpoint time before SIGKILL
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_a_cpu_only_job_keeps_the_default_scheduler() -> None:
    cpu = backend("gpushare").render(GpuRequest(), Target())
    job = manifest(gpu=cpu, holds_gpu=False, cpus=None, memory_bytes=None, models={})
    spec = job["spec"]["template"]["spec"]
    assert "schedulerName" not in spec and spec["containers"][0]["resources"] == {}
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in spec["containers"][0]["env"]


def pod(name: str, phase: str, created: str, terminated: dict | None = None) -> dict:  # type: ignore[type-arg]
    statuses = [{"state": {"terminated": terminated}}] if terminated else []
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def test_a_job_is_read_from_its_conditions_and_its_last_pod() -> None:
    assert observed({"status": {}}, []).state == STARTING
    running = observed({"status": {"active": 1}}, [pod("j-a", "Running", "2026-01-01T00:00:01Z")])
    assert running.state == RUNNING and running.pod == "j-a"
    done = {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    assert observed(done, []).state == SUCCEEDED
    failed = {
        "status": {
            "failed": 2,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}],
        }
    }
    pods = [
        pod("j-a", "Failed", "2026-01-01T00:00:01Z", {"exitCode": 1}),
        pod("j-b", "Failed", "2026-01-01T00:00:20Z", {"exitCode": 137, "reason": "OOMKilled"}),
    ]
    read = observed(failed, pods)
    assert (read.state, read.exit_code, read.reason, read.failures, read.pod) == (FAILED, 137, "OOMKilled", 2, "j-b")
    late = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    assert observed(late, []).stop_kind == TIME_LIMIT
    target_only = {"status": {"conditions": [{"type": "FailureTarget", "status": "True", "reason": "x"}]}}
    assert observed(target_only, []).state == STARTING  # not ended until the controller writes Failed
