"""`gpuslice bench class-day`, the model on a short day (the full figures: `gpuslice bench class-day`)."""

import pytest

from bench.classday import DESIGN_SEEDS, ORACLE, REGIMES, Day, report, run, simulate

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


def test_the_report_names_the_seeds_every_regime_and_the_bound() -> None:
    text = report(run(DESIGN_SEEDS[:1], SHORT))
    assert text.startswith("gpuslice bench class-day: seeds 1-1 (model designed on 1-5)")
    assert all(regime in text for regime in REGIMES)
    assert "oracle vs retry (line+reclaim, each forgotten slice freed the moment its owner leaves" in text


def test_an_unknown_regime_is_named() -> None:
    with pytest.raises(ValueError, match="use one of retry, line, line\\+reclaim, oracle"):
        simulate("fifo", SHORT, 1)
