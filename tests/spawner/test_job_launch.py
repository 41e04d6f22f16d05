"""What the dispatcher prepares for a job's runner on one machine (no process is started)."""

from __future__ import annotations

import sys
from pathlib import Path

from spawner.gpus import simulated_gpus
from spawner.job_launch import Machine, launch
from spawner.job_ledger import JobLedger
from spawner.jobs import JobPlan, JobSpec, line_entry
from spawner.shares import GiB, MiB


def test_a_jobs_files_and_output_are_capped_by_the_settings_class_first(tmp_path: Path) -> None:
    """Its output is on the platform's data disk: RLIMIT_FSIZE (``limits.job_file``) stops a job that prints
    without end; a class's own limit goes over the machine's, and the default is 1 GiB."""
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    spec = JobSpec.model_validate({"command": ["yes"]})
    jobs = {}
    for group in ("ml101", None):
        plan = JobPlan(0, None, None, "no GPU", "default", sys.prefix, group, 0, str(tmp_path / "home"))
        jobs[group] = ledger.submit("ann", spec, plan, lambda i, now, p=plan: line_entry(i, "ann", spec, p, now, now))
    machine = Machine(tmp_path / "data", simulated_gpus("1x16GiB:T4"), "/hook", {}, confinement=None)
    assert launch(machine, jobs[None], []).file_limit_bytes == GiB
    settings = {"job_file": "2GiB", "classes": {"ml101": {"job_file": "64MiB"}}}
    machine = Machine(tmp_path / "data", simulated_gpus("1x16GiB:T4"), "/hook", settings, confinement=None)
    assert launch(machine, jobs["ml101"], []).file_limit_bytes == 64 * MiB
    assert launch(machine, jobs[None], []).file_limit_bytes == 2 * GiB
