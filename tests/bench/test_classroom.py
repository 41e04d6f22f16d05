"""`gpuslice bench class` with a small class (the figures for 50 are in docs/load.md)."""

import warnings

from bench.classroom import run
from bench.portal import PAGES, TEACHING


def test_a_small_class_starts_runs_a_cell_and_leaves_nothing() -> None:
    result = run(users=3)
    ours, plain = result["gpuslice"], result["plain_jupyterhub"]
    for side in (ours, plain):
        assert side["failures"] == {}, side["failure_examples"]
        assert side["ready_s"]["max"] > 0 and side["cell_s"]["p95"] >= side["ready_s"]["p50"]
    assert ours["over_commit"] == 0 and ours["leaked_allocations"] == 0
    assert result["ready_ratio"]["p95"] > 0


def test_portal_sessions_keep_answering_while_a_small_class_spawns() -> None:
    result = run(users=3, portal_sessions=2)
    assert result["gpuslice"]["failures"] == {}, result["gpuslice"]["failure_examples"]
    portal = result["portal"]
    assert portal["sessions"] == 2
    if portal["first_page"]["reloaded"]:  # shown in the run's warnings summary: what a person reloaded
        warnings.warn(f"a session's first portal page was reloaded: {portal['first_page']['reloaded']}", stacklevel=1)
    assert portal["first_page"]["failures"] == {} and portal["first_page"]["pages"] == 2, portal
    assert portal["idle"]["failures"] == {}, portal  # which page failed and why (CI keeps only this output)
    admin_pages = {**PAGES, **TEACHING}.values()  # the sessions are admins: the Teaching page too
    assert portal["idle"]["pages"] == 2 * 2 * len(admin_pages)  # 2 sessions, 2 rounds of every page each
    assert portal["during_class"]["pages"] > 0 and portal["during_class"]["failures"] == {}, portal
    assert 0 < portal["during_class"]["p50_s"] <= portal["during_class"]["max_s"]
    assert set(portal["idle"]["first_paint_p95_s"]) == {f"{page} (admin)" for page in admin_pages}
