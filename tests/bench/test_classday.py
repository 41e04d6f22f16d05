"""`gpuslice bench class-day`, the model on a short day (the full figures: `gpuslice bench class-day`)."""

import re
from dataclasses import replace as replace_day

import pytest

from bench.classday import (
    DESIGN_SEEDS,
    IDLE_ONLY,
    ORACLE,
    PLATFORM,
    REGIMES,
    TARGETS,
    VARIANTS,
    Day,
    report,
    report_sweep,
    run,
    simulate,
    students,
    sweep,
    what_if,
)
from hub.cli import main
from spawner.waitline import LEFT

SHORT = Day(students=16, labs=(9 * 60.0,), lab_minutes=60.0)


@pytest.mark.parametrize("regime", REGIMES)
def test_no_regime_over_commits_a_card(regime: str) -> None:
    out = simulate(regime, SHORT, DESIGN_SEEDS[0])
    assert out.over_commits == 0
    assert out.served + out.gave_up >= 1 and len(out.waits) >= out.served


def test_with_room_for_everyone_nobody_waits() -> None:
    roomy = Day(students=8, labs=(9 * 60.0,), cards="2x16GiB:T4", slice_gib=4)
    for regime in REGIMES:
        out = simulate(regime, roomy, DESIGN_SEEDS[0])
        assert out.served == 8 and max(out.waits) <= 0.5, regime  # placed in the step they arrive


def test_reclaiming_frees_forgotten_slices_for_those_waiting() -> None:
    everyone_forgets = Day(students=16, labs=(9 * 60.0,), lab_minutes=60.0, forget_share=1.0)
    line = simulate("line", everyone_forgets, DESIGN_SEEDS[0])
    reclaim = simulate("line+reclaim", everyone_forgets, DESIGN_SEEDS[0])
    assert reclaim.reclaimed > 0 and line.reclaimed == 0
    assert reclaim.idle_while_waiting < line.idle_while_waiting


def test_the_oracle_bound_holds_no_forgotten_slice() -> None:
    """Everyone forgets: reclaiming still holds each forgotten slice until it has been idle long
    enough; the bound frees it when its owner leaves, so it holds far less idle and waits less."""
    everyone_forgets = Day(students=16, labs=(9 * 60.0,), lab_minutes=60.0, forget_share=1.0)
    reclaim = simulate("line+reclaim", everyone_forgets, DESIGN_SEEDS[0])
    bound = simulate(ORACLE, everyone_forgets, DESIGN_SEEDS[0])
    assert bound.idle_while_waiting < reclaim.idle_while_waiting
    assert sum(bound.waits) < sum(reclaim.waits)
    assert bound.students == reclaim.students and bound.over_commits == 0


def test_the_report_names_the_seeds_every_regime_the_bound_and_each_target() -> None:
    result = run(DESIGN_SEEDS[:1], SHORT)
    text = report(result)
    assert text.startswith("gpuslice bench class-day: seeds 1-1 (model designed on 1-5)")
    assert all(regime in text for regime in (*REGIMES, *VARIANTS, ORACLE, "line+reclaim, patient"))
    assert "line+reclaim: p95 wait vs the oracle's x" in text and "(target <= x1.10: " in text
    assert "each forgotten slice freed the moment its owner leaves" in text
    assert set(result["targets"]) == {key for key, _, _ in TARGETS}


def test_an_unknown_regime_is_named() -> None:
    with pytest.raises(ValueError, match="use one of retry, line, idle only, line\\+reclaim, \\+max_hold"):
        simulate("fifo", SHORT, 1)


# Pauses of 20 minutes on average, spent at the page with input every half minute: the rule before
# presence stops them at its 3 idle minutes; the platform's rule counts the input as use.
READING = Day(
    students=16,
    labs=(9 * 60.0,),
    lab_minutes=60.0,
    gap_mean=20.0,
    gpu_idle_timeout=3.0,
    warn_before=1.0,
    away_pause_share=0.0,
    input_every=0.5,
)


def test_a_student_giving_input_in_a_long_pause_keeps_the_slice_which_idleness_alone_took() -> None:
    before = simulate(IDLE_ONLY, READING, DESIGN_SEEDS[0])
    now = simulate(PLATFORM, READING, DESIGN_SEEDS[0])
    # Reclaiming's stops only: JupyterHub's culler reads activity alone (docs/platform.md#presence) and
    # stops a reader of a pause past its 60 minutes in every regime, input or not.
    assert sum(d.working for d in before.decisions) > 5 and not any(d.working for d in now.decisions)
    # Only the forgotten: a closed tab is left after 2 minutes, a tab left open idle after this day's 3.
    forgotten = {s.name for s in students(READING, DESIGN_SEEDS[0]) if s.forgets}
    assert now.decisions and {d.student for d in now.decisions} <= forgotten


def test_a_forgotten_server_with_its_tab_closed_goes_to_the_line_sooner_than_one_left_open() -> None:
    forgetful = replace_day(SHORT, forget_share=1.0)
    closed = simulate(PLATFORM, replace_day(forgetful, close_tab_share=1.0), DESIGN_SEEDS[0])
    left_open = simulate(PLATFORM, replace_day(forgetful, close_tab_share=0.0), DESIGN_SEEDS[0])
    assert closed.idle_while_waiting < left_open.idle_while_waiting
    assert sum(closed.waits) < sum(left_open.waits)


def test_every_stop_is_a_decision_with_its_reason_and_a_closed_tab_is_left_not_idle() -> None:
    # Every pause at the page: a pause away from it (a page without input) past gpu_no_input_timeout is
    # "left" at work on the platform too (docs/load.md), so this day has none.
    day = replace_day(SHORT, forget_share=1.0, close_tab_share=1.0, away_pause_share=0.0)
    out = simulate(PLATFORM, day, DESIGN_SEEDS[0])
    left = [d for d in out.decisions if d.reason == LEFT]
    assert left and all(not d.working for d in left)  # nobody at work is "left" on this day
    assert out.reclaimed == len(out.decisions)


# Long gaps between bursts and a reclaim timeout shorter than most of them: reclaiming stops
# students who still have work, and they wait again.
# Pauses spent away from the page (no input): idle for the rule before presence and the platform's alike.
LONG_GAPS = Day(
    students=16,
    labs=(9 * 60.0,),
    lab_minutes=60.0,
    gap_mean=20.0,
    gpu_idle_timeout=3.0,
    warn_before=1.0,
    away_pause_share=1.0,
)


def test_a_student_stopped_in_a_gap_of_their_work_is_counted_as_interrupted_and_waits_again() -> None:
    reclaim = simulate("line+reclaim", LONG_GAPS, DESIGN_SEEDS[0])
    retry = simulate("retry", LONG_GAPS, DESIGN_SEEDS[0])
    # The retry baseline never reclaims; only JupyterHub's culler stops it in a gap of an hour or more.
    assert retry.reclaimed == 0 and reclaim.interrupted > 5 * max(retry.interrupted, 1)
    assert reclaim.interrupted <= reclaim.reclaimed
    assert len(reclaim.waits) >= reclaim.served + reclaim.interrupted  # each interruption is another wait
    # Each student's waits added up: the same minutes as the waits, one figure a student.
    assert len(reclaim.student_waits) == reclaim.students
    assert sum(reclaim.student_waits) == pytest.approx(sum(reclaim.waits))


def test_nobody_is_interrupted_when_nobody_pauses_longer_than_the_reclaim_timeout() -> None:
    short_gaps = Day(students=16, labs=(9 * 60.0,), lab_minutes=60.0, gap_mean=0.1)
    assert simulate("line+reclaim", short_gaps, DESIGN_SEEDS[0]).interrupted == 0


def test_a_what_if_changes_one_number_and_the_warning_follows_the_reclaim_timeout() -> None:
    day = Day()
    shorter = what_if(day, "gpu_idle_timeout", 6)
    assert shorter.gpu_idle_timeout == 6.0 and shorter.warn_before == 2.0  # warning_lead: a third below 9 min
    assert what_if(day, "gpu_idle_timeout", 30).warn_before == 3.0
    assert what_if(day, "students", 30).students == 30 and isinstance(what_if(day, "students", 30).students, int)
    assert what_if(day, "gap_mean", 2).__dict__ == {**day.__dict__, "gap_mean": 2.0}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("cards", 1, "no number 'cards' to vary: use one of students, "),
        ("forget_share", 1.5, "forget_share=1.5 is out of range: a share from 0 to 1"),
        ("patience", -1, "no negative numbers"),
        ("students", 2.5, "students is a whole number, not 2.5"),
        ("gpu_idle_timeout", 0, "gpu_idle_timeout must be above 0 minutes"),
    ],
)
def test_a_what_if_outside_the_day_is_refused_saying_why(name: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", "\\(")):
        what_if(Day(), name, value)


def test_a_sweep_compares_each_value_with_retry_on_the_same_day() -> None:
    result = sweep("gpu_idle_timeout", [15, 3], (DESIGN_SEEDS[0],), replace_day(LONG_GAPS, gpu_idle_timeout=15.0))
    long, short = result["rows"]
    assert (long["value"], short["value"]) == (15, 3)
    assert long["retry"] is short["retry"]  # the baseline never reclaims: one run serves both rows
    assert short["line+reclaim"]["interrupted_per_day"] > long["line+reclaim"]["interrupted_per_day"]
    text = report_sweep(result)
    assert text.startswith("gpuslice bench class-day --sweep gpu_idle_timeout: seeds 1-1;")
    assert "(the day's gpu_idle_timeout: 15)" in text and "interrupted" in text
    assert [line.split()[0] for line in text.splitlines()[2:4]] == ["15", "3"]


def test_a_sweep_of_a_number_the_baseline_reads_runs_the_baseline_for_each_value() -> None:
    result = sweep("forget_share", [0.0, 1.0], (DESIGN_SEEDS[0],), SHORT)
    nobody, everyone = result["rows"]
    assert nobody["retry"] is not everyone["retry"]
    assert nobody["retry"]["idle_gpu_hours_per_day"] < everyone["retry"]["idle_gpu_hours_per_day"]


def test_the_command_says_how_to_write_a_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match=re.escape("write FIELD=V1,V2,..., e.g. gpu_idle_timeout=15,10,5")):
        main(["bench", "class-day", "--sweep", "gpu_idle_timeout"])
    with pytest.raises(SystemExit, match="--sweep: the day has no number 'labs' to vary"):
        main(["bench", "class-day", "--sweep", "labs=1,2"])


def test_each_interruption_adds_a_wait_to_the_days_count() -> None:
    result = sweep("gpu_idle_timeout", [15, 3], (DESIGN_SEEDS[0],), replace_day(LONG_GAPS, gpu_idle_timeout=15.0))
    long, short = (row["line+reclaim"] for row in result["rows"])
    assert short["waits_per_day"] - long["waits_per_day"] >= short["interrupted_per_day"] - long["interrupted_per_day"]
    assert short["waits_per_day"] > long["waits_per_day"]
