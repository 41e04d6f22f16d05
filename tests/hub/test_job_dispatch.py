"""The dispatcher's look at the line, and jobs run by their runners without a hub (real processes, one machine).

The decisions are tested from literal inputs; the runs start real runners in sessions of their own
with the machine's confinement left out (the end-to-end test, tests/e2e/test_jobs.py, runs them
confined, as root, through the hub).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hub.job_dispatch import Dispatcher, decide, preempt_words
from spawner.cgroups import DEFAULT_LIMITS, LimitsError, parse_settings_limits
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.job_launch import Machine
from spawner.job_ledger import JobLedger, JobRecord, Looked
from spawner.jobs import (
    CANCEL,
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    JobPlan,
    JobSpec,
    Outcome,
    line_entry,
)
from spawner.ledger import Held
from spawner.processes import running
from spawner.shares import GiB
from spawner.waitline import Entry

CARDS = simulated_gpus("2x16GiB:T4")
HOOK = str(Path(__file__).resolve().parents[2] / "spawner" / "kernel_hook")


def new_job(ledger: JobLedger, home: Path, body: dict[str, object], user: str = "ann") -> JobRecord:
    spec = JobSpec.model_validate(body)
    gib = int(str(spec.gpu_memory).removesuffix("GiB") or 0)
    plan = JobPlan(
        0, gib * GiB or None, None, f"{gib} GiB of one GPU", "default", sys.prefix, None, gib * GiB, str(home)
    )
    return ledger.submit(user, spec, plan, lambda job_id, now: line_entry(job_id, user, spec, plan, now, now))


def records(jobs: list[JobRecord], ledger: JobLedger) -> list[JobRecord]:
    return [ledger.job(j.id) for j in jobs]  # type: ignore[misc]


def test_the_line_places_jobs_behind_a_person_and_stops_backfill_for_them(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    home = tmp_path / "home"
    normal = new_job(ledger, home, {"command": ["a"], "gpu_memory": "12GiB"})
    filler = new_job(ledger, home, {"command": ["a"], "gpu_memory": "16GiB", "priority": "backfill"}, user="cy")

    def look(holds: list[Held], line: list[Entry]) -> tuple[list[int], list[int]]:
        jobs = {j.id: j for j in ledger.jobs()}
        looked = Looked([j for j in jobs.values() if j.state in ("starting", "running", "stopping")], [], jobs.get)
        decided = decide(
            holds,
            line,
            [],
            looked,
            inventory_of=lambda rows: build_local(CARDS, [(h.gpu_index, h.allocation()) for h in rows]),
            words=lambda rows: "",
            budgets_now={},
            policy="default",
            now=time.time(),
        )
        return [p.job for p in decided.placements], [s.job for s in decided.stops]

    # Both fit: the normal job on one card, the backfill job on the other.
    assert look([], ledger.line()) == ([normal.id, filler.id], [])
    ledger.dispatch(
        lambda holds, line, res, jobs: decide(
            holds,
            line,
            res,
            jobs,
            inventory_of=lambda rows: build_local(CARDS, [(h.gpu_index, h.allocation()) for h in rows]),
            words=lambda rows: "",
            budgets_now={},
            policy="default",
            now=time.time(),
        )
    )
    holds = ledger.holdings()
    assert {h.key for h in holds} == {normal.key, filler.key}
    # A person wants 8 GiB: only the backfill job's card can hold it once that job is gone.
    person = Entry(
        "bob/",
        "bob",
        line_entry(0, "bob", normal.spec, normal.plan, 0, 0).demand,
        8 * GiB,
        None,
        time.time(),
        seen=time.time(),
        label="8 GiB of one GPU",
    )
    placements, stops = look(holds, [person])
    assert placements == [] and stops == [filler.id]
    assert preempt_words(person) == "preempted for bob (a notebook server, 8 GiB of one GPU)"


def look_and_place(ledger: JobLedger, most_cpu_jobs: int = DEFAULT_LIMITS.cpu_jobs) -> None:
    """One look at the line as the dispatcher takes it, without starting runners."""
    ledger.dispatch(
        lambda holds, line, res, jobs: decide(
            holds,
            line,
            res,
            jobs,
            inventory_of=lambda rows: build_local(CARDS, [(h.gpu_index, h.allocation()) for h in rows]),
            words=lambda rows: "",
            budgets_now={},
            policy="default",
            now=time.time(),
            most_cpu_jobs=most_cpu_jobs,
        )
    )


def test_one_person_runs_only_a_few_cpu_only_jobs_at_once(tmp_path: Path) -> None:
    """CPU-only jobs wait for no slice: a loop of submissions must not start them all at once."""
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    home = tmp_path / "home"
    most = DEFAULT_LIMITS.cpu_jobs
    anns = [new_job(ledger, home, {"command": ["a"]}) for _ in range(most + 2)]
    bobs = new_job(ledger, home, {"command": ["a"]}, user="bob")
    look_and_place(ledger)
    first, rest = anns[:most], anns[most:]
    assert [j.state for j in records([*first, bobs], ledger)] == [STARTING] * (most + 1)
    for job in records(rest, ledger):
        assert job.state == QUEUED
        assert job.reason == (
            f"waiting: ann has {most} CPU-only jobs running, the most one person may at once; it starts when one ends"
        )
    look_and_place(ledger)  # still full: nothing more starts
    assert [j.state for j in records(rest, ledger)] == [QUEUED, QUEUED]
    ledger.finish(first[0].id, Outcome(SUCCEEDED, "finished: exit code 0"), 0, None)
    look_and_place(ledger)  # one ended: the oldest waiting one starts
    assert [j.state for j in records(rest, ledger)] == [STARTING, QUEUED]


def test_the_settings_limits_cpu_jobs_is_how_many_cpu_only_jobs_one_person_runs(tmp_path: Path) -> None:
    """limits.cpu_jobs as gpuslice.yaml writes it, read as the dispatcher's service reads its --limits."""
    from hub.job_dispatch import cpu_jobs

    most = cpu_jobs(argparse.Namespace(limits=json.dumps({"cpu_jobs": 2, "memory": "2GiB"})))
    assert most == 2 and cpu_jobs(argparse.Namespace(limits="{}")) == DEFAULT_LIMITS.cpu_jobs
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    anns = [new_job(ledger, tmp_path / "home", {"command": ["a"]}) for _ in range(3)]
    look_and_place(ledger, most)
    assert [j.state for j in records(anns, ledger)] == [STARTING, STARTING, QUEUED]
    with pytest.raises(LimitsError, match=r"machine's limit, not a class's; set limits\.cpu_jobs"):
        parse_settings_limits({"classes": {"ml101": {"cpu_jobs": 9}}})
    with pytest.raises(LimitsError, match="cpu_jobs: must be a whole number from 1 to 1000, not 0"):
        parse_settings_limits({"cpu_jobs": 0})


def test_a_job_that_cannot_start_fails_and_frees_its_slice_without_stopping_the_others(tmp_path: Path) -> None:
    """Its owner made ~/models a file: the runner's launch cannot be prepared. Each such job ends failed,
    saying why, its slice released; the look goes on to the next (no process is started)."""
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").write_text("not a folder")
    plan = JobPlan(0, 4 * GiB, None, "4 GiB of one GPU", "default", sys.prefix, None, 4 * GiB, str(home))
    plan = JobPlan(**{**plan.to_json(), "models": {"langid-97": str(tmp_path / "market" / "langid-97")}})
    spec = JobSpec.model_validate({"command": ["true"], "gpu_memory": "4GiB", "models": ["langid-97"]})
    jobs = [ledger.submit("ann", spec, plan, lambda i, now: line_entry(i, "ann", spec, plan, now, now)) for _ in "ab"]
    machine = Machine(tmp_path / "data", CARDS, HOOK, {}, confinement=None, grace_s=5)
    dispatcher = Dispatcher(ledger, machine, lambda: [])
    dispatcher.step(time.time())
    for job in records(jobs, ledger):
        assert job.state == FAILED
        assert job.reason.startswith("could not start: ") and "models" in job.reason
    assert ledger.holdings() == [] and dispatcher.launched == {}
    dispatcher.step(time.time())  # nothing left to start, nothing stuck


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Until ``condition`` holds (the ledger is the event: a runner writes there)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.process
def test_jobs_run_end_and_say_why_through_their_runners(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    home = tmp_path / "home"
    home.mkdir()
    machine = Machine(tmp_path / "data", CARDS, HOOK, {}, confinement=None, grace_s=5)
    dispatcher = Dispatcher(ledger, machine, lambda: [])
    checkpoint = (
        "import os, signal, sys, time\n"
        "def stop(*_):\n"
        "    print('checkpoint at', os.environ['GPUSLICE_JOB_PREEMPTED'], flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('attempt', os.environ['GPUSLICE_JOB_ATTEMPT'], 'on', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        "time.sleep(60)\n"
    )
    done = new_job(ledger, home, {"command": ["python", "-c", "print('hello <b>world</b>')"]})
    oom = new_job(
        ledger,
        home,
        {
            "command": ["python", "-c", "raise SystemExit('torch.cuda.OutOfMemoryError: CUDA out of memory')"],
            "gpu_memory": "4GiB",
        },
    )
    missing = new_job(ledger, home, {"command": ["no-such-program-here"], "retries": 3})
    slow = new_job(ledger, home, {"command": ["sleep", "60"], "time_limit": 1})
    cancelled = new_job(ledger, home, {"command": ["sleep", "60"]})
    filler = new_job(
        ledger, home, {"command": ["python", "-c", checkpoint], "gpu_memory": "16GiB", "priority": "backfill"}
    )
    try:
        dispatcher.step(time.time())
        wait_for(lambda: ledger.job(cancelled.id).state == RUNNING, "the sleeper runs")  # type: ignore[union-attr]
        ledger.ask_stop(cancelled.id, CANCEL, "cancelled by ann")
        from hub.job_dispatch import signal_runner

        assert signal_runner(ledger.job(cancelled.id))  # type: ignore[arg-type]
        finished = {SUCCEEDED, FAILED, CANCELLED}
        wait_for(
            lambda: all(j.state in finished for j in records([done, oom, missing, slow, cancelled], ledger)), "ends"
        )
        got = {j.id: j for j in records([done, oom, missing, slow, cancelled], ledger)}
        assert got[done.id].state == SUCCEEDED and got[done.id].exit_code == 0
        log = (machine.jobs_dir / str(done.id) / "output.log").read_text()
        assert "hello <b>world</b>" in log and "--- gpuslice" in log
        assert oom_mode(machine, done.id) == 0o600
        assert got[oom.id].state == FAILED and got[oom.id].reason.startswith("out of GPU memory (4 GiB of one GPU)")
        assert got[missing.id].state == FAILED and got[missing.id].attempts == 1  # not retried: it never will start
        assert "could not start" in got[missing.id].reason
        assert got[slow.id].state == FAILED and got[slow.id].reason == "time limit: stopped after 1 s"
        assert got[cancelled.id].state == CANCELLED and got[cancelled.id].reason == "cancelled by ann"
        assert {h.key for h in ledger.holdings()} == {filler.key}  # every ended job's slice is back

        # The backfill job runs; a person who needs its card waits: it is told (SIGTERM), checkpoints, goes back.
        wait_for(lambda: "attempt 1" in log_of(machine, filler.id), "the backfill job runs")
        # A server holds the other card whole; bob's 16 GiB can only come from the backfill job's.
        other = next(g.index for g in CARDS if g.index not in {h.gpu_index for h in ledger.holdings()})
        ledger.allocate("x/", lambda held: [Held("x/", other, "x", "", 16 * GiB)])
        person = line_entry(0, "bob", filler.spec.model_copy(update={"priority": "normal"}), filler.plan, 0, 0)
        bob = Entry("bob/", "bob", person.demand, 16 * GiB, None, time.time(), seen=time.time())
        ledger.take_turn("bob/", lambda holds, line, mine, res: (None, bob))
        dispatcher.step(time.time())
        wait_for(lambda: ledger.job(filler.id).state == QUEUED, "the backfill job yields")  # type: ignore[union-attr]
        yielded = ledger.job(filler.id)
        assert yielded is not None and yielded.preemptions == 1 and "preempted for bob" in yielded.reason
        assert "checkpoint at 0" in log_of(machine, filler.id)
        dispatcher.step(time.time())
        assert ledger.job(filler.id).state == QUEUED  # type: ignore[union-attr]  # bob still waits
        ledger.leave_line("bob/")
        dispatcher.step(time.time())
        wait_for(lambda: "attempt 2" in log_of(machine, filler.id), "the backfill job runs again")

        # Its runner killed: the job dies with it, and is lost (it failed: its retries are 0).
        wait_for(lambda: ledger.job(filler.id).process is not None, "the runner records the job's process")  # type: ignore[union-attr]
        process = ledger.job(filler.id).process  # type: ignore[union-attr]
        runner = ledger.job(filler.id).runner  # type: ignore[union-attr]
        assert runner is not None
        os.kill(runner.pid, signal.SIGKILL)
        wait_for(lambda: not running(runner), "the runner ends")
        assert process is not None
        wait_for(lambda: not running(process), "the job ends with its runner")
        dispatcher.step(time.time())
        after = ledger.job(filler.id)
        assert after is not None and after.state == FAILED and after.reason.startswith("node lost: its runner ended")
    finally:
        for job in ledger.jobs():
            if job.state not in (SUCCEEDED, FAILED, CANCELLED):
                ledger.ask_stop(job.id, CANCEL, "the test ended")
                signal_runner_quietly(ledger.job(job.id))
        wait_for(lambda: all(j.runner is None for j in ledger.jobs()), "every runner ends", 30)
        for _, process in dispatcher.launched.values():
            process.wait(timeout=30)


def log_of(machine: Machine, job_id: int) -> str:
    path = machine.jobs_dir / str(job_id) / "output.log"
    return path.read_text() if path.exists() else ""


def oom_mode(machine: Machine, job_id: int) -> int:
    return (machine.jobs_dir / str(job_id) / "output.log").stat().st_mode & 0o777


def signal_runner_quietly(job: JobRecord | None) -> None:
    from hub.job_dispatch import signal_runner

    if job is not None:
        signal_runner(job)
