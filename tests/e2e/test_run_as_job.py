"""Run as job from JupyterLab, in a browser, on the real platform (the issue's browser test).

A student opens a notebook in JupyterLab, presses "Run as job" with a 4 GiB slice, closes JupyterLab,
and watches the job on the portal's Jobs page go from queued to running to succeeded; then opens the
executed notebook, saved beside the original with its outputs. The job is queued first because the
card is full; the student's own server holds a slice of the other card meanwhile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import requests

from tests.e2e.platform import Platform

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "visual"
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "train",
            "metadata": {},
            "outputs": [],
            "source": [
                "import os, time\n",
                "while not os.path.exists('go-on'): time.sleep(0.2)\n",
                "env = os.environ\n",
                "print('trained on', env['CUDA_VISIBLE_DEVICES'], 'within', env['GPUSLICE_GPU_MEMORY_BYTES'])",
            ],
        }
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def test_a_student_runs_a_notebook_as_a_job_from_jupyterlab_and_follows_it_in_the_portal(
    make_platform: object,
) -> None:
    from playwright.sync_api import sync_playwright

    from tests.e2e.browser import ARGS, CHROMIUM, login

    platform: Platform = make_platform(gpus={"simulate": "2x8GiB:T4"})  # type: ignore[operator]
    platform.start()
    student = platform.login("ana")
    assert student.api("POST", "/users/ana/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    student.wait_ready("ana")
    token = platform.token("ana")
    headers = {"Authorization": f"token {token}"}
    put = requests.put(
        f"{platform.url}/user/ana/api/contents/train.ipynb", headers=headers, json=NOTEBOOK_MODEL, timeout=60
    )
    assert put.status_code in (200, 201), put.text
    # Both cards are full (the admin's jobs hold the rest): the student's job waits in line first.
    admin_jobs = f"{platform.url}/hub/api/gpuslice/jobs"
    admin = {"Authorization": f"token {platform.token('admin')}"}
    sleeps = ["python", "-c", "import time; time.sleep(3600)"]
    blockers = [
        requests.post(admin_jobs, headers=admin, json={"command": sleeps, "gpu_memory": gib}, timeout=60).json()["job"][
            "id"
        ]
        for gib in ("8GiB", "4GiB")
    ]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        lab = context.new_page()
        login(lab, platform, "ana")
        lab.goto(f"{platform.url}/user/ana/lab/tree/train.ipynb")
        lab.wait_for_selector(".jp-Notebook", timeout=120_000)
        lab.click(".gpuslice-run-as-job")
        lab.wait_for_selector(".jp-Dialog >> text=Run as job: GPU", timeout=30_000)
        lab.click(".jp-Dialog .jp-mod-accept")  # 4GiB, the first choice
        lab.wait_for_selector(".jp-Dialog >> text=Run as job: time limit", timeout=30_000)
        lab.click(".jp-Dialog .jp-mod-accept")  # 1h
        toast = lab.wait_for_selector(".Toastify__toast >> text=Job ", timeout=60_000)
        assert toast is not None and "queued" in toast.inner_text()
        lab.screenshot(path=str(ARTIFACTS / "run-as-job-jupyterlab.png"))
        lab.close()  # JupyterLab closed: the job goes on without it

        jobs = requests.get(admin_jobs, headers=headers, timeout=60).json()["jobs"]
        job = next(j for j in jobs if j["spec"].get("notebook") == "train.ipynb")
        assert job["state"] == "queued" and job["gpu"] == "4 GiB of one GPU" and job["user"] == "ana"

        portal = context.new_page()
        portal.goto(f"{platform.url}/services/portal/jobs")
        portal.wait_for_selector("h1:has-text('Jobs')", timeout=60_000)
        portal.wait_for_selector("text=queued", timeout=60_000)
        portal.screenshot(path=str(ARTIFACTS / "run-as-job-portal-queued.png"), full_page=True)
        requests.post(f"{admin_jobs}/{blockers[0]}/cancel", headers=admin, timeout=60)  # a card frees
        portal.wait_for_selector("text=running", timeout=60_000)
        # The chosen job's own pane follows too, not only the table: it was read while queued.
        detail = "[data-testid=stMarkdown] >> text=/^running .* on 4 GiB of GPU/"
        portal.wait_for_selector(detail, timeout=60_000)
        (platform.data_dir / "homes" / "ana" / "go-on").write_text("")
        deadline = time.monotonic() + 120
        while (
            requests.get(f"{admin_jobs}/{job['id']}", headers=headers, timeout=60).json()["job"]["state"] != "succeeded"
        ):
            assert time.monotonic() < deadline, "the job did not succeed"
            time.sleep(0.5)
        portal.wait_for_selector("text=succeeded", timeout=60_000)
        portal.wait_for_selector("[data-testid=stMarkdown] >> text=finished: exit code 0", timeout=60_000)
        portal.screenshot(path=str(ARTIFACTS / "run-as-job-portal-succeeded.png"), full_page=True)

        executed = f"train.job-{job['id']}.ipynb"
        lab = context.new_page()
        lab.goto(f"{platform.url}/user/ana/lab/tree/{executed}")
        lab.wait_for_selector(".jp-OutputArea-output >> text=trained on", timeout=120_000)
        lab.screenshot(path=str(ARTIFACTS / "run-as-job-executed.png"))
        browser.close()
    requests.post(f"{admin_jobs}/{blockers[1]}/cancel", headers=admin, timeout=60)
    saved = requests.get(f"{platform.url}/user/ana/api/contents/{executed}", headers=headers, timeout=60).json()
    outputs = saved["content"]["cells"][0]["outputs"]
    assert "trained on" in outputs[0]["text"] and str(4 * 2**30) in outputs[0]["text"]


NOTEBOOK_MODEL = {"type": "notebook", "format": "json", "content": json.loads(json.dumps(NOTEBOOK))}
