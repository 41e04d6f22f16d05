"""Reclaiming by presence (spawner/waitline.py): who has left, who is pausing, and what each loses when.

Times are seconds; the rule's timeouts are the platform's defaults unless a test names others.
"""

import pytest

from spawner.line_timeouts import GPU_LEFT_TIMEOUT_S, GPU_NO_INPUT_TIMEOUT_S, GPU_RELEASE_TIMEOUT_S
from spawner.waitline import (
    HELD,
    IDLE,
    LEFT,
    RELEASED,
    Holder,
    Presence,
    PresenceRule,
    ReclaimWarning,
    away_since,
    due,
    follow_warnings,
    idle_since,
    reclaim,
    reclaims,
    release,
)

RULE = PresenceRule(stale_after=90.0)
IDLE_TIMEOUT = 900.0


def server(
    key: str,
    idle_from: float | None,
    *,
    pages: int = 1,
    connections: int | None = None,
    last_input: float | None = None,
    last_page: float | None = None,
    reported: float = 10_000.0,
    busy: bool = False,
    held_since: float | None = None,
    max_hold_s: float | None = None,
) -> Holder:
    """A GPU server idle (kernels and GPU) since ``idle_from``, with what it last reported of its owner."""
    seen = Presence(reported, pages, pages if connections is None else connections, busy, last_input, last_page)
    return Holder(key, True, idle_from, idle_from, held_since, max_hold_s, seen)


NOW = 10_000.0


def test_the_defaults_are_a_closed_tab_sooner_than_a_page_left_open_and_release_last() -> None:
    assert GPU_LEFT_TIMEOUT_S <= GPU_NO_INPUT_TIMEOUT_S < GPU_RELEASE_TIMEOUT_S


def test_a_closed_tab_is_away_from_its_closing_a_page_left_open_from_its_last_input() -> None:
    closed = server("ann/", 1000.0, pages=0, last_input=2000.0, last_page=2500.0)
    assert away_since(closed, NOW, RULE.stale_after) == 2500.0  # the tab closed after the last input
    left_open = server("bo/", 1000.0, pages=1, last_input=2000.0, last_page=9990.0)
    assert away_since(left_open, NOW, RULE.stale_after) == 2000.0  # an open page is no presence
    never_opened = server("cy/", 1000.0, pages=0)
    assert away_since(never_opened, NOW, RULE.stale_after) == 1000.0  # from its last use (its start)


def test_input_in_a_page_is_a_use_like_running_a_cell() -> None:
    assert idle_since(server("ann/", 1000.0, last_input=9000.0)) == 9000.0
    assert idle_since(Holder("bo/", True, 1000.0, 1000.0)) == 1000.0  # no report: kernels and GPU only
    assert idle_since(server("cy/", 1000.0, busy=True)) is None  # a kernel runs code now
    assert idle_since(server("di/", None)) is None


@pytest.mark.parametrize(
    "why,holder",
    [
        ("no report at all", Holder("ann/", True, 0.0, 0.0)),
        ("the report is older than stale_after", server("ann/", 0.0, pages=0, reported=NOW - 91)),
        ("another client is connected, which cannot say", server("ann/", 0.0, pages=0, connections=1)),
    ],
)
def test_when_nobody_can_tell_the_idle_rule_alone_applies(why: str, holder: Holder) -> None:
    assert away_since(holder, NOW, RULE.stale_after) is None, why
    found = due(holder, NOW, IDLE_TIMEOUT, RULE)
    assert found is not None and (found.reason, found.past) == (IDLE, NOW - IDLE_TIMEOUT), why
    assert release([holder], now=NOW, rule=RULE) == ([], []), why  # the culler's business, not release's


def test_a_closed_tab_goes_to_the_line_after_the_left_timeout_and_a_page_left_open_after_the_no_input_one() -> None:
    closed = server("ann/", NOW - 3000, pages=0, last_input=NOW - 200, last_page=NOW - GPU_LEFT_TIMEOUT_S)
    found = due(closed, NOW, IDLE_TIMEOUT, RULE)
    assert found is not None and (found.reason, found.past) == (LEFT, 0.0)
    assert found.lead == GPU_LEFT_TIMEOUT_S / 3  # warned a third of it ahead (under the 180 s lead)
    left_open = server("bo/", NOW - 3000, pages=1, last_input=NOW - GPU_NO_INPUT_TIMEOUT_S + 10)
    found = due(left_open, NOW, IDLE_TIMEOUT, RULE)
    assert found is not None and (found.reason, found.past) == (LEFT, -10.0)
    assert found.lead == min(180.0, GPU_NO_INPUT_TIMEOUT_S / 3)
    warn, stop = reclaim([closed, left_open], waiting=2, now=NOW, gpu_idle_timeout=IDLE_TIMEOUT, presence=RULE)
    assert (warn, stop) == (["bo/"], ["ann/"])


def test_a_student_who_keeps_giving_input_keeps_the_slice_past_the_idle_timeout_while_others_wait() -> None:
    """Reading and typing between runs: no cell ran for an hour, input a minute ago."""
    pausing = server("ann/", NOW - 3600, pages=1, last_input=NOW - 60)
    assert reclaim([pausing], waiting=5, now=NOW, gpu_idle_timeout=IDLE_TIMEOUT, presence=RULE) == ([], [])
    # Without presence the same server was reclaimed by idleness long ago: never sooner with it.
    assert reclaim([Holder("ann/", True, NOW - 3600, NOW - 3600)], waiting=5, now=NOW) == ([], ["ann/"])


def test_presence_never_makes_a_server_due_later_than_its_idleness_alone() -> None:
    """For any report, the left rule only adds a way to be due: the idle rule's moment stands."""
    for pages in (0, 1):
        for last_input in (None, NOW - 5000, NOW - 100):
            holder = server("ann/", NOW - 4000, pages=pages, last_input=last_input, last_page=NOW - 50)
            with_rule, alone = due(holder, NOW, IDLE_TIMEOUT, RULE), due(holder, NOW, IDLE_TIMEOUT, None)
            assert with_rule is not None and alone is not None and with_rule.past >= alone.past


def test_nobody_waiting_a_left_server_is_released_after_the_release_timeout_only() -> None:
    gone = server("ann/", NOW - 5000, pages=0, last_page=NOW - GPU_RELEASE_TIMEOUT_S)
    soon = server("bo/", NOW - 5000, pages=0, last_page=NOW - GPU_RELEASE_TIMEOUT_S + 100)
    pausing = server("cy/", NOW - 5000, pages=1, last_input=NOW - 30)
    assert reclaim([gone, soon, pausing], waiting=0, now=NOW, presence=RULE) == ([], [])
    assert release([gone, soon, pausing], now=NOW, rule=RULE) == (["bo/"], ["ann/"])


def test_one_look_names_each_server_once_for_the_first_reason_that_applies() -> None:
    holders = [
        server("idle/", NOW - 2000, pages=0, connections=1),  # an editor connected: the idle rule, due long ago
        server("left/", NOW - 600, pages=0, last_page=NOW - 500),  # idle for 10 min only, the tab closed for 8
        server("held/", None, busy=True, held_since=NOW - 7300, max_hold_s=7200),
        server("gone/", NOW - 800, pages=0, last_page=NOW - 700),
        Holder("cpu/", False, 0.0, 0.0),
    ]
    decided = reclaims(holders, waiting=3, now=NOW, gpu_idle_timeout=IDLE_TIMEOUT, presence=RULE)
    assert decided.stop == {"idle/": IDLE, "gone/": LEFT, "left/": LEFT}  # the line needs three: the most overdue
    nobody_waits = reclaims(holders, waiting=0, now=NOW, gpu_idle_timeout=IDLE_TIMEOUT, presence=RULE)
    assert nobody_waits.stop == {"gone/": RELEASED} and nobody_waits.warn == {"left/": RELEASED}  # 160 s before
    one_waits = reclaims(holders[2:3], waiting=1, now=NOW, gpu_idle_timeout=IDLE_TIMEOUT, presence=RULE)
    assert one_waits.stop == {"held/": HELD}  # used or not


def test_a_warning_stands_for_its_reason_lapses_when_used_and_stops_at_the_time_it_announced() -> None:
    closed = server("ann/", NOW - 600, pages=0, last_page=NOW - GPU_LEFT_TIMEOUT_S + 40)  # due in 40 s
    decided = reclaims([closed], waiting=1, now=NOW, presence=RULE)
    warned, stop = follow_warnings({}, decided, NOW, report_every=30)
    assert stop == [] and warned == {"ann/": ReclaimWarning(NOW, LEFT, NOW + 40 + 1.1 * 30)}
    later = NOW + 45  # due, but the announced time has not come
    warned, stop = follow_warnings(warned, reclaims([closed], waiting=1, now=later, presence=RULE), later, 30)
    assert stop == [] and warned["ann/"].at == NOW
    back = server("ann/", NOW - 600, pages=1, last_input=later + 5)  # a page opened again, a key pressed
    warned, stop = follow_warnings(warned, reclaims([back], waiting=1, now=later + 10, presence=RULE), later + 10, 30)
    assert (warned, stop) == ({}, [])  # the warning lapsed
    gone_again = server("ann/", NOW - 700, pages=0, last_page=NOW - 650)
    at = NOW + 100
    warned, stop = follow_warnings({}, reclaims([gone_again], waiting=1, now=at, presence=RULE), at, 30)
    assert stop == []  # due long ago, but warned only now: the stop comes at the announced time
    announced = warned["ann/"].stops_at
    decided = reclaims([gone_again], waiting=1, now=announced, presence=RULE)
    assert follow_warnings(warned, decided, announced, 30)[1] == ["ann/"]


def test_a_new_reason_is_a_new_warning() -> None:
    old = {"ann/": ReclaimWarning(NOW - 100, IDLE, NOW + 113)}
    left = server("ann/", NOW - 700, pages=0, last_page=NOW - 650)
    warned, _ = follow_warnings(old, reclaims([left], waiting=1, now=NOW, presence=RULE), NOW, 30)
    assert warned["ann/"].reason == LEFT and warned["ann/"].at == NOW


def test_least_served_first_puts_who_held_least_today_ahead_of_who_came_a_little_earlier() -> None:
    from spawner.placement import Demand
    from spawner.waitline import Entry, fair_order

    def entry(user: str, arrived: float, served: float = 0.0) -> Entry:
        return Entry(f"{user}/", user, Demand(slice_units=4.0), 4, "ml101", arrived, served=served)

    came_first_held_an_hour = entry("ann", 100.0, served=3600.0)
    came_later_held_nothing = entry("bo", 400.0)
    assert [e.user for e in fair_order([came_first_held_an_hour, came_later_held_nothing])] == ["bo", "ann"]
    # Round-robin (served 0 for everyone): arrival decides, as before.
    assert [e.user for e in fair_order([entry("ann", 100.0), entry("bo", 400.0)])] == ["ann", "bo"]
    # A second server still waits behind everyone's first, whatever was held.
    second = Entry("bo/lab", "bo", Demand(slice_units=4.0), 4, "ml101", 500.0)
    assert [e.key for e in fair_order([second, came_first_held_an_hour, came_later_held_nothing])][-1] == "bo/lab"


def test_the_save_a_warning_causes_is_not_a_use_but_a_later_activity_is() -> None:
    from spawner.waitline import IDLE, ReclaimWarning, warning_save_window, without_warning_saves

    warned_at, lead = 10_000.0, 120.0
    window = warning_save_window(lead)  # JupyterLab's next look (20 s) and the save's own time
    warned = {"ann/": ReclaimWarning(warned_at, IDLE, warned_at + lead)}
    saved = Holder("ann/", True, warned_at + 4, warned_at + 4)  # JupyterLab saved all on the warning
    later = Holder("ann/", True, warned_at + 60, warned_at + 60)  # she ran a cell a minute later
    before = {"ann/": warned_at - 900}
    (as_warned,) = without_warning_saves([saved], warned, before, window)
    assert (as_warned.kernels_idle_since, as_warned.gpu_idle_since) == (warned_at - 900, warned_at - 900)
    assert without_warning_saves([later], warned, before, window) == [later]
    assert without_warning_saves([saved], {}, before, window) == [saved]  # no warning: every activity counts


def test_the_window_of_a_warnings_save_is_one_look_of_the_lab_not_the_whole_lead() -> None:
    """A short lead (a class's 20 s in the tests, a minute's idle timeout): a save 15 s after the warning,
    5 s before the stop, is the student's own, and keeps the slice."""
    from spawner.waitline import IDLE, ReclaimWarning, warning_save_window, without_warning_saves

    warned_at, lead = 10_000.0, 20.0
    assert warning_save_window(lead) < 15 < lead
    assert warning_save_window(900.0) == 35.0  # a 15 min lead: the lab looks every 30 s at most
    warned = {"ann/": ReclaimWarning(warned_at, IDLE, warned_at + lead)}
    own = Holder("ann/", True, warned_at + 15, warned_at + 15)
    assert without_warning_saves([own], warned, {"ann/": warned_at - 60}, warning_save_window(lead)) == [own]
