"""Jobs in the ledger: in line on submission, placed atomically with their slices, ended with the slice released."""

import time
from pathlib import Path

import pytest

from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.job_ledger import Dispatch, JobLedger, JobRecord, Looked, Placement, Stop, TooManyQueuedError
from spawner.jobs import (
    CANCEL,
    CANCELLED,
    MOST_QUEUED_PER_USER,
    PREEMPT,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPING,
    SUCCEEDED,
    JobPlan,
    JobSpec,
    Outcome,
    line_entry,
)
from spawner.ledger import Held, Ledger
from spawner.processes import Proc
from spawner.shares import GiB
from spawner.waitline import Entry, Reservation, admit

CARDS = simulated_gpus("2x16GiB:T4")


def submit(ledger: JobLedger, user: str = "ann", gib: int = 4, priority: str = "normal") -> JobRecord:
    spec = JobSpec.model_validate({"command": ["python", "train.py"], "gpu_memory": f"{gib}GiB", "priority": priority})
    plan = JobPlan(0, gib * GiB, None, f"{gib} GiB of one GPU", "default", "/usr", None, gib * GiB, f"/h/{user}")
    return ledger.submit(user, spec, plan, lambda job_id, now: line_entry(job_id, user, spec, plan, now, now))


def place_what_the_line_admits(
    holds: list[Held], line: list[Entry], reservations: list[Reservation], jobs: Looked
) -> Dispatch:
    inventory = build_local(CARDS, [(h.gpu_index, h.allocation()) for h in holds])
    placements = []
    for a in admit(line, inventory, budgets={}, group_bytes={}, now=time.time(), reservations=reservations):
        job = jobs.queued(a.entry.key)
        if job is not None:
            rows = [Held(job.key, CARDS[a.choice.gpus[0]].index, job.user, f"job:{job.id}", job.plan.asked_bytes)]
            placements.append(Placement(job.id, rows, f"GPU {a.choice.gpus[0]}"))
    return Dispatch(placements)


def test_a_job_waits_in_the_one_line_then_is_placed_with_its_slice_in_one_transaction(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    job = submit(ledger, gib=12)
    assert job.state == QUEUED and [e.key for e in ledger.line()] == ["ann/job:1"]
    # A server holds 8 GiB of each card: the 12 GiB job waits.
    for card in (0, 1):
        ledger.allocate(f"s{card}/", lambda held, c=card: [Held(f"s{c}/", c, f"s{c}", "", 8 * GiB)])
    decided, active = ledger.dispatch(place_what_the_line_admits)
    assert decided.placements == [] and active == {} and len(ledger.line()) == 1
    ledger.release("s0/")
    decided, active = ledger.dispatch(place_what_the_line_admits)
    assert [p.job for p in decided.placements] == [1] and active[1].state == STARTING and active[1].attempts == 1
    assert ledger.line() == [] and {h.key for h in ledger.holdings()} == {"s1/", "ann/job:1"}
    assert [w.outcome for w in ledger.waits(0)] == ["placed"]
    # Placed once only: a second look finds it no longer in line.
    assert ledger.dispatch(place_what_the_line_admits)[0].placements == []


def test_the_line_sees_a_queued_job_as_present_while_the_dispatcher_looks(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    submit(ledger)
    ledger.allocate("x/", lambda held: [Held("x/", 0, "x", "", 16 * GiB), Held("x/", 1, "x", "", 16 * GiB)])
    before = ledger.line()[0].last_seen()
    time.sleep(0.01)
    ledger.dispatch(lambda *_: Dispatch())
    assert ledger.line()[0].last_seen() > before


def test_cancelling_a_queued_job_takes_it_out_of_line_and_a_running_one_asks_its_runner(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    queued, running = submit(ledger), submit(ledger)
    ledger.allocate("x/", lambda held: [Held("x/", 0, "x", "", 16 * GiB), Held("x/", 1, "x", "", 12 * GiB)])
    ledger.dispatch(place_what_the_line_admits)  # one 4 GiB job fits
    placed = {j.id for j in ledger.jobs(states=[STARTING])}
    assert placed == {queued.id}
    ledger.process_started(queued.id, Proc(123, 1.0), "")
    assert ledger.job(queued.id).state == RUNNING  # type: ignore[union-attr]
    ledger.ask_stop(running.id, CANCEL, "cancelled by ann")
    after = ledger.job(running.id)
    assert after is not None and after.state == CANCELLED and after.reason == "cancelled by ann"
    assert [w.outcome for w in ledger.waits(0)] == ["placed", "cancelled"]
    ledger.ask_stop(queued.id, PREEMPT, "preempted for bob")
    ledger.ask_stop(queued.id, PREEMPT, "preempted for cy")  # the first stop asked stands
    stopping = ledger.job(queued.id)
    assert stopping is not None and stopping.state == STOPPING and stopping.stop_reason == "preempted for bob"


def test_a_cancel_during_a_preemption_ends_the_job_instead_of_putting_it_back_in_line(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    job = submit(ledger, priority="backfill")
    ledger.dispatch(place_what_the_line_admits)
    ledger.ask_stop(job.id, PREEMPT, "preempted for bob")  # its runner reads this when it is signalled
    ledger.ask_stop(job.id, CANCEL, "cancelled by ann")
    ledger.ask_stop(job.id, PREEMPT, "preempted for cy")  # nothing stands above a cancel
    stopping = ledger.job(job.id)
    assert stopping is not None and (stopping.stop_kind, stopping.reason) == (CANCEL, "stopping: cancelled by ann")
    # The runner ends the attempt as the preemption it saw: the stored cancel wins.
    requeue = line_entry(job.id, "ann", job.spec, job.plan, job.submitted, time.time())
    after = ledger.finish(job.id, Outcome(QUEUED, "preempted for bob; back in line", preempted=True), -15, requeue)
    assert after is not None and (after.state, after.reason) == (CANCELLED, "cancelled by ann")
    assert ledger.line() == [] and ledger.holdings() == []
    assert ledger.dispatch(place_what_the_line_admits)[0].placements == []


def test_a_refused_check_changes_nothing(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    job = submit(ledger)

    def not_yours(found: JobRecord) -> None:
        raise PermissionError(f"bob may not cancel {found.user}'s job")

    with pytest.raises(PermissionError):
        ledger.ask_stop(job.id, CANCEL, "cancelled by bob", not_yours)
    assert ledger.job(job.id).state == QUEUED and len(ledger.line()) == 1  # type: ignore[union-attr]


def test_an_ended_attempt_releases_its_slice_and_a_requeued_job_keeps_its_place(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    job = submit(ledger, priority="backfill")
    ledger.dispatch(place_what_the_line_admits)
    ledger.ask_stop(job.id, PREEMPT, "preempted for bob's server")
    requeue = line_entry(job.id, "ann", job.spec, job.plan, job.submitted, time.time())
    after = ledger.finish(job.id, Outcome(QUEUED, "preempted; back in line", preempted=True), -15, requeue)
    assert after is not None and after.state == QUEUED and after.preemptions == 1 and after.failures == 0
    assert ledger.holdings() == [] and ledger.line()[0].arrived == job.submitted and ledger.line()[0].backfill
    ledger.dispatch(place_what_the_line_admits)
    done = ledger.finish(job.id, Outcome(SUCCEEDED, "finished: exit code 0"), 0, None)
    assert done is not None and done.state == SUCCEEDED and done.attempts == 2 and done.finished is not None
    assert ledger.finish(job.id, Outcome(SUCCEEDED, "again"), 0, None).reason == "finished: exit code 0"  # type: ignore[union-attr]
    assert [e.state for e in ledger.events(job.id)] == [QUEUED, STARTING, STOPPING, QUEUED, STARTING, SUCCEEDED]


def test_one_person_cannot_fill_the_line(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    ledger.allocate("x/", lambda held: [Held("x/", 0, "x", "", 16 * GiB), Held("x/", 1, "x", "", 16 * GiB)])
    for _ in range(MOST_QUEUED_PER_USER):
        submit(ledger)
    with pytest.raises(TooManyQueuedError, match="cancel some"):
        submit(ledger)
    submit(ledger, user="bob")


def test_jobs_are_in_the_same_file_an_older_ledger_is_brought_forward_to(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).allocate("x/", lambda held: [Held("x/", 0, "x", "", GiB)])
    ledger = JobLedger(path)
    job = submit(ledger)
    assert ledger.jobs(users=["ann"])[0].id == job.id and ledger.jobs(users=[]) == []
    assert Ledger(path).line()[0].key == "ann/job:1"  # the servers' side reads the same line


def test_the_dispatcher_stops_only_active_jobs(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    active, queued = submit(ledger, gib=16, priority="backfill"), submit(ledger, gib=16, priority="backfill")
    ledger.allocate("x/", lambda held: [Held("x/", 1, "x", "", 16 * GiB)])
    ledger.dispatch(place_what_the_line_admits)
    stops = [Stop(active.id, PREEMPT, "preempted for bob"), Stop(queued.id, PREEMPT, "preempted for bob")]
    _, after = ledger.dispatch(lambda *_: Dispatch(stops=stops))
    assert after[active.id].state == STOPPING and after[active.id].stop_reason == "preempted for bob"
    assert ledger.job(queued.id).state == QUEUED  # type: ignore[union-attr]
