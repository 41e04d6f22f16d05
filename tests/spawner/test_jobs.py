"""Batch jobs' pure parts: what people may ask, how an attempt's end reads, backfill in the line, preemption."""

import pytest
from pydantic import ValidationError

from spawner.checked import problems
from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, Inventory, build_local
from spawner.jobs import (
    CANCEL,
    CANCELLED,
    FAILED,
    LOST,
    PREEMPT,
    QUEUED,
    SHUTDOWN,
    SUCCEEDED,
    TIME_LIMIT,
    Ending,
    JobPlan,
    JobSpec,
    executed_path,
    is_job_key,
    job_env,
    job_id_of,
    job_key,
    line_entry,
    notebook_path,
    outcome,
)
from spawner.jobs_backfill import Running, preemptions, without
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import Entry, admit, fair_order, positions, waits_for_room

TWO_CARDS = simulated_gpus("2x16GiB:T4")


def spec_error(body: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate(body)
    return problems(raised.value)


def test_a_command_job_with_every_setting_reads_back_as_written() -> None:
    body = {
        "name": "train",
        "command": ["python", "train.py", "--epochs", "3"],
        "image": "pytorch",
        "gpu_memory": "4GiB",
        "cpus": 2,
        "memory": "8GiB",
        "env": {"SEED": "1"},
        "models": ["langid-97", "langid-97"],
        "time_limit": "90min",
        "retries": 2,
        "priority": "backfill",
    }
    spec = JobSpec.model_validate(body)
    assert spec.time_limit_s == 5400 and spec.backfill and spec.models == ("langid-97",)
    assert JobSpec.model_validate(spec.to_json()) == spec  # what the ledger keeps, read back
    assert JobSpec.stored(spec.to_json()) == spec  # and read back unchecked, as the ledger does
    assert spec.title() == "train"
    assert JobSpec.model_validate({"command": ["python", "a.py"]}).title() == "python a.py"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "give a command"),
        ({"command": ["a"], "notebook": "n.ipynb"}, "not both"),
        ({"command": "python train.py"}, "must be a list"),
        ({"command": []}, "must be a list of words"),
        ({"command": ["a"], "user": "bob"}, "unknown key(s) user"),  # nobody submits as someone else
        ({"command": ["a"], "time_limit": "soon"}, "time_limit must be a duration such as 2h"),
        ({"command": ["a"], "time_limit": -5}, "time_limit must be a duration"),
        ({"command": ["a"], "time_limit": "9" * 400}, "time_limit must be at most 7 days (168h or 604800 seconds)"),
        ({"command": ["a"], "time_limit": 10**400}, "time_limit must be at most 7 days"),
        ({"command": ["a"], "time_limit": float("inf")}, "time_limit must be at most 7 days"),
        ({"command": ["a"], "time_limit": "169h"}, "time_limit must be at most 7 days"),
        ({"command": ["a"], "retries": 99}, "retries must be at most 10"),
        ({"command": ["a"], "priority": "urgent"}, "priority"),
        ({"command": ["a"], "env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "platform's to set"),
        ({"command": ["a"], "env": {"GPUSLICE_JOB_ID": "9"}}, "platform's to set"),
        ({"command": ["a"], "env": {"A B": "x"}}, "not a variable name"),
        ({"command": ["a"], "memory": "lots"}, "memory"),
        ({"command": ["a"], "cpus": 0}, "CPU cores above 0"),
        ({"notebook": "../bob/secret.ipynb"}, "climbs out"),
        ({"notebook": "/home/bob/secret.ipynb"}, "relative to your home"),
        ({"notebook": "~bob/x.ipynb"}, "relative to your home"),
        ({"notebook": "notes.txt"}, "must be a notebook"),
        ({"command": ["a"], "name": "two\nlines"}, "one line"),
    ],
)
def test_bad_jobs_are_refused_in_words_that_say_what_to_write(body: dict[str, object], words: str) -> None:
    assert words in spec_error(body)


def test_notebook_paths_stay_in_the_home_and_the_executed_copy_goes_beside() -> None:
    assert str(notebook_path("work/train.ipynb")) == "work/train.ipynb"
    assert str(executed_path(notebook_path("work/train.ipynb"), 12)) == "work/train.job-12.ipynb"
    with pytest.raises(ValueError, match="climbs out"):
        notebook_path("work/../../x.ipynb")


def test_job_keys_never_name_a_server() -> None:
    key = job_key("ann", 12)
    assert key == "ann/job:12" and is_job_key(key) and job_id_of(key) == 12
    assert not is_job_key("ann/") and not is_job_key("ann/job-12") and job_id_of("ann/job-12") is None


def end(code: int | None, **kwargs: object) -> Ending:
    return Ending(code, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ending", "state", "words"),
    [
        (end(0), SUCCEEDED, "finished: exit code 0"),
        (end(-15, stop_kind=CANCEL, stop_reason="cancelled by ann"), CANCELLED, "cancelled by ann"),
        (end(-15, stop_kind=PREEMPT, stop_reason="preempted for bob's server"), QUEUED, "preempted for bob's server"),
        (end(-15, stop_kind=SHUTDOWN), QUEUED, "the platform stopped"),
        (end(-9, stop_kind=TIME_LIMIT), FAILED, "time limit: stopped after 1 h 30 min"),
        (end(0, stop_kind=TIME_LIMIT), FAILED, "time limit"),
        (end(1, log_tail="torch.cuda.OutOfMemoryError: CUDA out of memory."), FAILED, "out of GPU memory (4 GiB"),
        (end(127), FAILED, "could not start: command not found"),
        (end(126), FAILED, "could not start: the command is not executable"),
        (end(None, start_error="no such image"), FAILED, "could not start: no such image"),
        (end(-9), FAILED, "killed by SIGKILL: most likely out of memory (over its memory limit of 2 GiB)"),
        (end(-11), FAILED, "ended by SIGSEGV"),
        (end(3), FAILED, "failed: exit code 3"),
        (end(-25), FAILED, "file size limit of 1 GiB reached: its output or a file it wrote grew too large"),
        (end(1, output_full=True), FAILED, "file size limit of 1 GiB reached"),
        (end(None, stop_kind=LOST, stop_reason="its runner ended"), FAILED, "node lost: its runner ended"),
    ],
)
def test_how_an_attempt_ended_in_words(ending: Ending, state: str, words: str) -> None:
    result = outcome(
        ending,
        failures_before=0,
        retries=0,
        time_limit_s=5400,
        memory_limit_bytes=2 * GiB,
        slice_words="4 GiB of one GPU",
        file_limit_bytes=GiB,
    )
    assert result.state == state and words in result.reason


def test_retries_count_failures_not_preemptions_and_not_hopeless_starts() -> None:
    first = outcome(end(3), failures_before=0, retries=2, time_limit_s=60)
    assert first.state == QUEUED and first.failed and "retrying (1 retry left after this one)" in first.reason
    last = outcome(end(3), failures_before=2, retries=2, time_limit_s=60)
    assert last.state == FAILED and last.reason == "failed: exit code 3"
    lost = outcome(end(None, stop_kind=LOST, stop_reason="x"), failures_before=0, retries=1, time_limit_s=60)
    assert lost.state == QUEUED  # a node lost is worth another try
    assert outcome(end(127), failures_before=0, retries=5, time_limit_s=60).state == FAILED  # never will
    preempted = outcome(end(-15, stop_kind=PREEMPT), failures_before=0, retries=0, time_limit_s=60)
    assert preempted.state == QUEUED and preempted.preempted and not preempted.failed


def test_a_backfill_job_is_told_it_may_be_stopped_and_how_often_it_was() -> None:
    spec = JobSpec.model_validate({"command": ["a"], "priority": "backfill", "time_limit": "2h"})
    env = job_env(7, 3, spec, preemptions=2, grace_s=30)
    assert env["GPUSLICE_JOB_PREEMPTIBLE"] == "1" and env["GPUSLICE_JOB_PREEMPTED"] == "2"
    assert env["GPUSLICE_JOB_GRACE_S"] == "30" and env["GPUSLICE_JOB_ATTEMPT"] == "3"
    normal = job_env(7, 1, spec.model_copy(update={"priority": "normal"}), preemptions=0)
    assert "GPUSLICE_JOB_PREEMPTIBLE" not in normal and normal["GPUSLICE_JOB_TIME_LIMIT_S"] == "7200"


# -- backfill in the line ------------------------------------------------------------------------------


def person(key: str, arrived: float, gib: int = 4, group: str | None = None) -> Entry:
    return Entry(key, key.split("/")[0], Demand(slice_units=float(gib * GiB)), gib * GiB, group, arrived, seen=arrived)


def backfill(job: int, user: str, arrived: float, gib: int = 4, group: str | None = None) -> Entry:
    spec = JobSpec.model_validate({"command": ["a"], "priority": "backfill", "gpu_memory": f"{gib}GiB"})
    plan = JobPlan(0, gib * GiB, None, f"{gib} GiB of one GPU", "default", "/", group, gib * GiB, "/home")
    return line_entry(job, user, spec, plan, arrived, now=arrived)


def machine(held: dict[str, tuple[int, int]]) -> Inventory:
    allocations = [(gpu, Allocation(k.split("/")[0], "", gib * GiB, k)) for k, (gpu, gib) in held.items()]
    return build_local(TWO_CARDS, allocations)


def test_backfill_goes_behind_everyone_and_takes_no_turn_from_its_owners_other_requests() -> None:
    line = [backfill(1, "ann", 1), backfill(2, "ann", 2), person("ann/", 3), person("bob/", 4)]
    assert [e.key for e in fair_order(line)] == ["ann/", "bob/", "ann/job:1", "ann/job:2"]
    assert positions(line)["ann/"] == 1
    assert not waits_for_room(line[0], now=5) and waits_for_room(line[2], now=5)


def test_backfill_is_placed_only_when_nobody_else_waits_and_fills_what_fits() -> None:
    now = 10.0
    # One card has 4 GiB left: a 12 GiB backfill job does not fit, the 4 GiB one behind it does.
    inventory = machine({"x/": (0, 16), "y/": (1, 12)})
    jobs = [backfill(1, "ann", 1, gib=12), backfill(2, "ann", 2, gib=4)]
    placed = admit(jobs, inventory, budgets={}, group_bytes={}, now=now)
    assert [a.entry.key for a in placed] == ["ann/job:2"]
    # A person who cannot be placed waits: no backfill job goes, even where one would fit.
    waiting = admit([person("bob/", 3, gib=8), *jobs], inventory, budgets={}, group_bytes={}, now=now)
    assert waiting == []
    # A person who is placed leaves room the backfill job may then take.
    both = admit(
        [person("bob/", 3, gib=2), *jobs], machine({"x/": (0, 16), "y/": (1, 10)}), budgets={}, group_bytes={}, now=now
    )
    assert [a.entry.key for a in both] == ["bob/", "ann/job:2"]


def test_a_backfill_job_over_its_class_budget_holds_up_nobody() -> None:
    jobs = [backfill(1, "ann", 1, group="ml"), person("cy/", 2, group="art")]
    placed = admit(jobs, machine({}), budgets={"ml": 2 * GiB}, group_bytes={}, now=5)
    assert [a.entry.key for a in placed] == ["cy/"]


def running_jobs(*specs: tuple[int, str, int, int, float]) -> tuple[Inventory, list[Running]]:
    """Backfill jobs (id, user, card, GiB, started) on the two cards."""
    held = {job_key(user, job): (card, gib) for job, user, card, gib, _ in specs}
    running = [Running(job_key(user, job), user, None, gib * GiB, started) for job, user, _, gib, started in specs]
    return machine(held), running


def test_a_person_who_waits_gets_the_fewest_backfill_jobs_stopped_the_newest_first() -> None:
    inventory, running = running_jobs(
        (1, "ann", 0, 8, 100.0), (2, "ann", 0, 8, 200.0), (3, "ann", 1, 8, 300.0), (4, "ann", 1, 8, 50.0)
    )
    line = [person("bob/", 400, gib=4)]
    chosen = preemptions(line, inventory, running, stopping=set(), budgets={}, group_bytes={}, held_by_user={}, now=401)
    assert [(p.key, p.for_entry.key) for p in chosen] == [("ann/job:3", "bob/")]  # one 8 GiB job is enough


def test_nothing_is_stopped_twice_nor_for_room_already_coming() -> None:
    inventory, running = running_jobs((1, "ann", 0, 16, 100.0), (2, "ann", 1, 16, 200.0))
    line = [person("bob/", 400, gib=4)]
    args = {"budgets": {}, "group_bytes": {}, "held_by_user": {}, "now": 401.0}
    assert preemptions(line, inventory, running, stopping={"ann/job:2"}, **args) == []  # type: ignore[arg-type]
    two = [person("bob/", 400, gib=16), person("cy/", 401, gib=16)]
    chosen = preemptions(two, inventory, running, stopping=set(), **args)  # type: ignore[arg-type]
    assert {(p.key, p.for_entry.key) for p in chosen} == {("ann/job:2", "bob/"), ("ann/job:1", "cy/")}


def test_no_backfill_job_is_stopped_for_a_wait_it_does_not_cause() -> None:
    # The person needs a whole 16 GiB card; servers hold 8 GiB on each card, a backfill job 4 GiB on one.
    inventory = machine({"x/": (0, 8), "y/": (1, 8), "ann/job:1": (1, 4)})
    running = [Running("ann/job:1", "ann", None, 4 * GiB, 10.0)]
    line = [person("bob/", 20, gib=16)]
    args = {"stopping": set(), "budgets": {}, "group_bytes": {}, "held_by_user": {}, "now": 21.0}
    assert preemptions(line, inventory, running, **args) == []  # type: ignore[arg-type]
    assert preemptions([], inventory, running, **args) == []  # type: ignore[arg-type]


def test_a_classmate_held_back_by_the_budget_gets_a_backfill_jobs_share_of_it() -> None:
    inventory, _ = running_jobs((1, "ann", 0, 4, 10.0))
    running = [Running("ann/job:1", "ann", "ml", 4 * GiB, 10.0)]
    line = [person("bob/", 20, gib=4, group="ml")]
    chosen = preemptions(
        line,
        inventory,
        running,
        stopping=set(),
        budgets={"ml": 4 * GiB},
        group_bytes={"ml": 4 * GiB},
        held_by_user={},
        now=21,
    )
    assert [p.key for p in chosen] == ["ann/job:1"]


def test_without_frees_only_the_named_keys() -> None:
    inventory = machine({"a/": (0, 4), "b/": (0, 4)})
    freed = without(inventory, {"a/"})
    assert [a.owner for g in freed.gpus() for a in g.allocations] == ["b/"]
    assert len(list(inventory.allocations())) == 2  # the original is left as it was


def test_without_frees_a_kube_jobs_pod_by_its_user_and_server() -> None:
    # On Kubernetes an allocation's owner is its pod; the line names the backfill job by its ledger key.
    pods = [
        (0, Allocation("cy", "job:5", 4 * GiB, "gpuslice-job-5-1-x2kq")),
        (0, Allocation("b", "", 4 * GiB, "b-pod")),
    ]
    freed = without(build_local(TWO_CARDS, pods), {"cy/job:5"})
    assert [a.owner for g in freed.gpus() for a in g.allocations] == ["b-pod"]
