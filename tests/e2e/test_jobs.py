"""Batch jobs on the real single-machine platform, as root under the defaults (an account per user), in one start.

A class of two students and their teacher, one 16 GiB card, a class budget of 8 GiB. Checked in order:
bad jobs refused with what to write and nothing written; a job through the command line; a job that
holds the class's whole budget, confined as a server is (its owner's account, its own cgroup, its slice
pinned, the hook's cap); a classmate's job queued behind the budget, saying so; the attacker (the
classmate reading, cancelling and resubmitting someone's job, a teacher reading a student's output, a
forged owner); the hub killed with kill -9 while jobs are queued, running and finished, and nothing
lost; the jobs then finishing in order; a backfill job yielding its card to a student's server within
its grace period (SIGTERM, a checkpoint) and running again once the student is done; and the platform's
full stop leaving nothing behind.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from hub.accounts import passwords_path, set_password
from spawner.jobs import GRACE_S
from tests.e2e.platform import PASSWORD, Platform

STUDENTS, TEACHER = ("jann", "jbob"), "jtina"
REPO = Path(__file__).resolve().parents[2]
WAIT_FOR_GO = (
    "import os, sys, time\n"
    "print('as', os.environ['USER'], os.getuid(), 'gpu', os.environ.get('CUDA_VISIBLE_DEVICES'),"
    " 'cap', os.environ.get('GPUSLICE_GPU_MEMORY_BYTES'), flush=True)\n"
    "print(open('/proc/self/cgroup').read().strip(), flush=True)\n"
    "while not os.path.exists('go'): time.sleep(0.1)\n"
    "print('done', flush=True)\n"
)
YIELDS = (
    "import os, signal, sys, time\n"
    "def checkpoint(*_):\n"
    "    print('checkpoint: told', os.environ['GPUSLICE_JOB_PREEMPTIBLE'], flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, checkpoint)\n"
    "if int(os.environ['GPUSLICE_JOB_PREEMPTED']):\n"
    "    print('resumed after', os.environ['GPUSLICE_JOB_PREEMPTED'], 'preemption', flush=True); sys.exit(0)\n"
    "print('filling the night', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


class Api:
    """One person's token against the jobs API."""

    def __init__(self, platform: Platform, token: str) -> None:
        self.base = f"{platform.url}/hub/api/gpuslice/jobs"
        self.headers = {"Authorization": f"token {token}"}

    def call(self, method: str, path: str = "", **kwargs: Any) -> requests.Response:
        return requests.request(method, f"{self.base}{path}", headers=self.headers, timeout=60, **kwargs)

    def submit(self, **spec: Any) -> requests.Response:
        return self.call("POST", json=spec)

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.call("GET", f"/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json()["job"])

    def wait(
        self, job_id: int, done: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 120
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if done(job):
                return job
            assert time.monotonic() < deadline, f"job {job_id} {what}: not within {timeout_s} s: {job}"
            time.sleep(0.2)


def log_of(api: Api, job_id: int) -> str:
    return api.call("GET", f"/{job_id}/log").text


@pytest.fixture
def root_platform() -> Iterator[Platform]:
    if os.geteuid() != 0:
        pytest.skip("jobs run as their owners' accounts only as root (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="gpuslice-jobs-"))
    root.chmod(0o755)
    settings = {
        "gpus": {"simulate": "1x16GiB:T4"},
        "isolation": None,  # the default as root: an account per user
        "groups": {
            "default": {"max_slice": None, "max_gpus": None, "budget": None, "servers_per_user": None},
            "jobs101": {"members": list(STUDENTS), "teachers": [TEACHER], "max_slice": "8GiB", "budget": "8GiB"},
        },
    }
    platform = Platform(root, settings)
    platform.data_dir.mkdir(mode=0o700)
    set_password(passwords_path(platform.data_dir), TEACHER, PASSWORD)  # as `gpuslice user set-password`
    try:
        platform.start(timeout_s=300)  # the first start as root builds the users' environment
        yield platform
    finally:
        try:
            platform.stop()
        finally:
            for name in (*STUDENTS, TEACHER):
                subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)


def test_jobs_queue_run_survive_the_hub_and_yield_to_people(root_platform: Platform) -> None:
    platform = root_platform
    ann, bob, tina, admin = (Api(platform, platform.token(n)) for n in (*STUDENTS, TEACHER, "admin"))

    # -- bad jobs: a clear refusal, and nothing written ---------------------------------------------------
    refusals: dict[int, list[dict[str, Any]]] = {
        400: [
            {"command": ["true"], "image": "no-such-image"},
            {"command": ["true"], "models": ["no-such-model"]},
            {"command": ["true"], "time_limit": "soon"},
            {"notebook": "missing.ipynb"},
            {"notebook": "../jupyter-jbob/notes.ipynb"},
            {"command": ["true"], "user": "jbob"},  # nobody submits as someone else
            {"command": ["true"], "gpus": 2},  # more cards than this machine has
        ],
        403: [{"command": ["true"], "gpu_memory": "12GiB"}],  # above the class's largest slice
    }
    for status, bodies in refusals.items():
        for body in bodies:
            answer = ann.submit(**body)
            assert answer.status_code == status, (body, answer.text)
            assert answer.json()["message"], body
    assert "Unknown image 'no-such-image'" in ann.submit(command=["true"], image="no-such-image").json()["message"]
    assert "allows slices up to 8 GiB" in ann.submit(command=["true"], gpu_memory="12GiB").json()["message"]
    assert ann.call("GET").json()["jobs"] == [] and platform.ledger() == []

    # -- the command line, with the user's token from a file ------------------------------------------------
    token_file = platform.root / "ann-token"
    token_file.write_text(ann.headers["Authorization"].split()[1])
    cli = [sys.executable, "-m", "hub.cli", "job", "--url", platform.url, "--token-file", str(token_file)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    said = subprocess.run(
        [*cli, "submit", "--name", "from-cli", "--wait", "--", "python", "-c", "print('hello from the cli')"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert said.returncode == 0, said.stdout + said.stderr
    assert "hello from the cli" in said.stdout and "succeeded: finished: exit code 0" in said.stdout
    listed = subprocess.run([*cli, "ls"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "from-cli" in listed and "succeeded" in listed
    cli_job = int(said.stdout.split()[1])

    # -- a job holding the class's budget runs confined as its owner; a classmate's waits behind it --------
    holding = ann.submit(name="holds-the-budget", command=["python", "-c", WAIT_FOR_GO], gpu_memory="8GiB")
    assert holding.status_code == 201, holding.text
    a = holding.json()["job"]["id"]
    running = ann.wait(a, lambda j: j["state"] == "running", "runs")
    owner = pwd.getpwnam("jupyter-jann")
    ann.wait(a, lambda j: "gpuslice-" in log_of(ann, a), "says where it runs")
    log = log_of(ann, a)
    assert f"as jupyter-jann {owner.pw_uid} gpu 0 cap {8 * 2**30}" in log
    assert "gpuslice-" in log.split("as jupyter-jann")[1]  # its own cgroup or scope
    assert running["placed"] == "8 GiB of GPU 0 (T4, simulated)" and running["cards"] == [0]
    b = bob.submit(name="behind", command=["python", "-c", "print('bob ran')"], gpu_memory="4GiB").json()["job"]["id"]
    queued = bob.job(b)
    assert queued["state"] == "queued" and queued["queue"]["position"] == 1
    assert "class jobs101 is using its whole GPU budget" in queued["queue"]["why"]
    # The line is one: the Queue API shows the job among the waiting servers.
    line = requests.get(f"{platform.url}/hub/api/gpuslice/line", headers=admin.headers, timeout=30).json()["line"]
    assert [(w["user"], w["server"]) for w in line] == [("jbob", f"job:{b}")]

    # -- the attacker: a classmate, a teacher ---------------------------------------------------------------
    assert bob.call("GET", f"/{a}").status_code == 404  # not there for him
    assert bob.call("GET", f"/{a}/log").status_code == 404
    assert bob.call("POST", f"/{a}/cancel").status_code == 404
    assert bob.call("POST", f"/{a}/resubmit").status_code == 404
    assert [j["id"] for j in bob.call("GET", params={"user": "jann"}).json()["jobs"]] == []
    assert {j["id"] for j in tina.call("GET").json()["jobs"]} == {a, b, cli_job}  # her class's jobs
    assert tina.call("GET", f"/{a}/log").status_code == 403  # their output is theirs
    assert tina.call("POST", f"/{a}/resubmit").status_code == 403  # a job runs as whoever submits it
    assert "as jupyter-jann" in admin.call("GET", f"/{a}/log").text
    log_file = platform.data_dir / "jobs" / str(a) / "output.log"
    assert log_file.stat().st_mode & 0o777 == 0o600 and log_file.stat().st_uid == 0
    assert (platform.data_dir / "jobs").stat().st_mode & 0o777 == 0o700
    no_token = requests.get(admin.base, timeout=30)
    assert no_token.status_code == 403

    # -- kill -9 of the hub with jobs queued, running and finished: nothing lost ---------------------------
    pid_before = _job_pid(platform, a)
    platform.kill_hub()
    platform.start()
    assert ann.job(a)["state"] == "running" and _job_pid(platform, a) == pid_before  # the same process, adopted
    assert Path(f"/proc/{pid_before}").exists()
    assert bob.job(b)["state"] == "queued" and ann.job(cli_job)["state"] == "succeeded"
    go = Path(owner.pw_dir) / "go"
    go.write_text("")
    assert ann.wait(a, lambda j: j["state"] == "succeeded", "ends")["reason"] == "finished: exit code 0"
    assert "done" in log_of(ann, a)
    assert bob.wait(b, lambda j: j["state"] == "succeeded", "runs once the budget is free")["attempts"] == 1

    # -- backfill: it fills the card, yields to a student within its grace period, and runs again later ----
    filler = admin.submit(name="night", command=["python", "-c", YIELDS], gpu_memory="16GiB", priority="backfill")
    c = filler.json()["job"]["id"]
    admin.wait(c, lambda j: "filling the night" in log_of(admin, c), "runs")
    asked = time.monotonic()
    started = requests.post(
        f"{platform.url}/hub/api/users/jann/server",
        headers=ann.headers,
        json={"gpu_memory": "4GiB", "wait": True},
        timeout=60,
    )
    assert started.status_code in (201, 202), started.text
    yielded = admin.wait(c, lambda j: j["state"] == "queued", "yields")
    assert (
        yielded["preemptions"] == 1 and "preempted for jann (a notebook server, 4 GiB of one GPU)" in yielded["reason"]
    )
    assert "checkpoint: told 1" in log_of(admin, c)
    platform.login("jann").wait_ready("jann", timeout_s=180)
    held = [row for row in platform.ledger() if row[0] == "jann/"]
    assert held == [("jann/", 0, 4 * 2**30)]
    assert time.monotonic() - asked < GRACE_S + 60  # the slice came within the grace period and a start
    stopped = requests.delete(f"{platform.url}/hub/api/users/jann/server", headers=ann.headers, timeout=120)
    assert stopped.status_code in (202, 204)
    again = admin.wait(c, lambda j: j["state"] == "succeeded", "runs again once the student is done")
    assert again["attempts"] == 2 and "resumed after 1 preemption" in log_of(admin, c)


def _job_pid(platform: Platform, job_id: int) -> int:
    """The job's process as the ledger records it (read straight from SQLite, as root)."""
    import sqlite3

    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        return int(db.execute("SELECT pid FROM job WHERE id = ?", (job_id,)).fetchone()[0])
    finally:
        db.close()
