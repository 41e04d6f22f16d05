"""Batch jobs on Kubernetes: a real JupyterHub with KubeGpuSpawner, the job dispatcher, and the API double's
scheduler, kubelet and Job controller (tests/kube/job_controller.py), in one hub start.

One card of 8 GiB. A job that holds it is a batch/v1 Job whose pod carries gpushare's resources; a
second waits in the one line with no Job until the card frees; the hub is killed with kill -9 and the
new one carries on; the Job controller's retries, deadline and conditions come back as the job's end
in words; a backfill job yields its card to a student's server (its Job deleted: SIGTERM, the grace
period) and runs again once the student is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.kube.conftest import gpushare_node
from tests.kube.test_kube_restart import RestartableHub, running_hub

JOBS = "/apis/batch/v1/namespaces/gpuslice/jobs"
WAIT_FOR = (
    "import os, sys, time\n"
    "print('job', os.environ['GPUSLICE_JOB_ID'], 'attempt', os.environ['GPUSLICE_JOB_ATTEMPT'], flush=True)\n"
    "while not os.path.exists(os.environ['GO']): time.sleep(0.1)\n"
    "print('done', flush=True)\n"
)
YIELDS = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('checkpoint', flush=True), sys.exit(0)))\n"
    "if int(os.environ['GPUSLICE_JOB_PREEMPTED']): print('resumed', flush=True); sys.exit(0)\n"
    "print('filling', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


@pytest.fixture
def one_card_with_jobs(tmp_path: Path) -> Iterator[RestartableHub]:
    yield from running_hub(tmp_path, [gpushare_node("gpu-a", 1, 8)], {"GPUSLICE_TEST_JOBS": "1"})


class Jobs:
    def __init__(self, hub: RestartableHub, user: str) -> None:
        kube = hub.hub
        made = kube.api("POST", f"/users/{user}/tokens", json={"note": "jobs"})
        assert made.status_code == 201, made.text
        self.base = f"{kube.url}/hub/api/gpuslice/jobs"
        self.headers = {"Authorization": f"token {made.json()['token']}"}

    def call(self, method: str, path: str = "", **kwargs: Any) -> requests.Response:
        return requests.request(method, f"{self.base}{path}", headers=self.headers, timeout=60, **kwargs)

    def submit(self, **spec: Any) -> int:
        answer = self.call("POST", json=spec)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["job"]["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.call("GET", f"/{job_id}").json()["job"])

    def wait(
        self, job_id: int, done: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 120
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not done(job := self.job(job_id)):
            assert time.monotonic() < deadline, f"job {job_id} {what}: not within {timeout_s} s: {job}"
            time.sleep(0.2)
        return job

    def log(self, job_id: int) -> str:
        return self.call("GET", f"/{job_id}/log").text


def k8s_jobs(hub: RestartableHub) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["labels"]["gpuslice.io/job"]: j for j in hub.hub.k8s(JOBS)["items"]}


@pytest.mark.waits
def test_jobs_are_batch_jobs_made_by_the_line_and_yield_to_people(one_card_with_jobs: RestartableHub) -> None:
    hub, root = one_card_with_jobs, one_card_with_jobs.root
    assert hub.hub.api("POST", "/users", json={"usernames": ["ann", "bob", "cy"]}).status_code == 201
    ann, bob, cy = Jobs(hub, "ann"), Jobs(hub, "bob"), Jobs(hub, "cy")

    # A job holding the card is a Job with the job's limits; a second waits with no Job at all.
    env = {"GO": str(root / "go-a")}
    a = ann.submit(command=["python", "-c", WAIT_FOR], gpu_memory="8GiB", env=env, time_limit="10min", retries=2)
    ann.wait(a, lambda j: j["state"] == "running", "runs")
    made = k8s_jobs(hub)[str(a)]
    spec = made["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (2, 600, 86400)
    pod = spec["template"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "8"
    assert pod["metadata"]["annotations"]["hub.jupyter.org/servername"] == f"job:{a}"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["terminationGracePeriodSeconds"] == 30
    ann.wait(a, lambda j: f"job {a} attempt 1" in ann.log(a), "its pod's log reads through the API")
    b = bob.submit(command=["python", "-c", "print('bob ran')"], gpu_memory="4GiB")
    assert bob.job(b)["state"] == "queued" and str(b) not in k8s_jobs(hub)  # no Job, no pod, until placed
    assert bob.call("GET", f"/{a}/log").status_code == 404  # another's job is not there for him

    # The Job controller's ends, in words: retries used up, the deadline.
    crash = cy.submit(command=["python", "-c", "raise SystemExit(3)"], retries=1)
    slow = cy.submit(command=["python", "-c", "import time; time.sleep(60)"], time_limit=3)

    # kill -9 of the hub: the new one's dispatcher carries on from the cluster and the ledger.
    hub.kill_9()
    hub.start()
    hub.wait_healthy()
    assert ann.job(a)["state"] == "running" and bob.job(b)["state"] == "queued"
    (root / "go-a").write_text("")
    assert ann.wait(a, lambda j: j["state"] == "succeeded", "ends")["reason"] == "finished: exit code 0"
    assert bob.wait(b, lambda j: j["state"] == "succeeded", "runs once the card is free")["attempts"] == 1
    assert "bob ran" in bob.log(b)
    failed = cy.wait(crash, lambda j: j["state"] == "failed", "fails after its retry", timeout_s=90)
    assert failed["reason"] == "failed: exit code 3" and k8s_jobs(hub)[str(crash)]["status"]["failed"] == 2
    late = cy.wait(slow, lambda j: j["state"] == "failed", "runs out of time")
    assert late["reason"].startswith("time limit")

    # Backfill: it fills the card, yields to a student's server, runs again after.
    c = cy.submit(command=["python", "-c", YIELDS], gpu_memory="8GiB", priority="backfill")
    cy.wait(c, lambda j: "filling" in cy.log(c), "runs")
    started = hub.hub.api("POST", "/users/ann/server", json={"gpu_memory": "4GiB", "wait": True})
    assert started.status_code in (201, 202), started.text
    yielded = cy.wait(c, lambda j: j["state"] == "queued", "yields")
    assert yielded["preemptions"] == 1 and "preempted for ann (a notebook server" in yielded["reason"]
    hub.hub.wait_ready("ann", timeout_s=120)
    assert hub.hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    again = cy.wait(c, lambda j: j["state"] == "succeeded", "runs again", timeout_s=120)
    assert again["attempts"] == 2 and "resumed" in cy.log(c)

    # A cancel deletes the Job.
    d = cy.submit(command=["python", "-c", "import time; time.sleep(60)"])
    cy.wait(d, lambda j: j["state"] == "running", "runs")
    assert cy.call("POST", f"/{d}/cancel").status_code == 200
    assert cy.wait(d, lambda j: j["state"] == "cancelled", "is cancelled")["reason"] == "cancelled by cy"
    deadline = time.monotonic() + 60
    while str(d) in k8s_jobs(hub):
        assert time.monotonic() < deadline, "the cancelled job's Job is still there"
        time.sleep(0.2)
