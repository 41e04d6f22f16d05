"""`gpuslice bench class` with a small class (the figures for 50 are in docs/load.md).

One run, both hubs, with a portal session: each run starts two platforms and six notebook servers,
and the class's figures without sessions come from the same code (bench/classroom.py run_class). One
session: it opens page after page for as long as the class starts, so each more is a browser busy
beside the class on the same cores (two made the test 185 s of CPU in the whole suite).
"""

import warnings

from bench.classroom import run
from bench.portal import PAGES, TEACHING


def test_a_small_class_starts_runs_a_cell_and_leaves_nothing_while_a_portal_session_keeps_answering() -> None:
    result = run(users=3, portal_sessions=1, idle_rounds=1)
    ours, plain = result["gpuslice"], result["plain_jupyterhub"]
    for side in (ours, plain):
        assert side["failures"] == {}, side["failure_examples"]
        assert side["ready_s"]["max"] > 0 and side["cell_s"]["p95"] >= side["ready_s"]["p50"]
    assert ours["over_commit"] == 0 and ours["leaked_allocations"] == 0
    assert result["ready_ratio"]["p95"] > 0
    portal = result["portal"]
    assert portal["sessions"] == 1
    if portal["first_page"]["reloaded"]:  # shown in the run's warnings summary: what a person reloaded
        warnings.warn(f"a session's first portal page was reloaded: {portal['first_page']['reloaded']}", stacklevel=1)
    assert portal["first_page"]["failures"] == {} and portal["first_page"]["pages"] == 1, portal
    assert portal["idle"]["failures"] == {}, portal  # which page failed and why (CI keeps only this output)
    admin_pages = {**PAGES, **TEACHING}.values()  # the session is an admin's: the Teaching page too
    assert portal["idle"]["pages"] == len(admin_pages)  # one round of every page
    assert portal["during_class"]["pages"] > 0 and portal["during_class"]["failures"] == {}, portal
    assert 0 < portal["during_class"]["p50_s"] <= portal["during_class"]["max_s"]
    assert set(portal["idle"]["first_paint_p95_s"]) == {f"{page} (admin)" for page in admin_pages}
