"""The GPU line's warning for its owner: when it stands, its words, and what /hub/gpuslice/notice answers.

(In the browser, JupyterLab's notification and the hub's home page: tests/e2e/test_waiting_line.py.)
"""

from types import SimpleNamespace

import pytest

from hub.notice import home_notices, next_look_s, notices
from spawner.ledger import ServerEvent, reclaim_notice
from spawner.waitline import LEFT, RELEASED, WARNED, activity_report_interval, stop_at, warning_lead

WARNED_AT = 1_763_900_000.0  # 2025-11-23 12:13:20 UTC


def warned(at: float = WARNED_AT) -> ServerEvent:
    return ServerEvent("ann/", "warned", 100, "idle while others wait for a GPU: stopped in 180 s unless used", at)


def test_a_warning_stands_from_the_warned_event_until_the_stop_it_announces_is_done() -> None:
    stop_after = stop_at(0.0, 180.0, activity_report_interval(180.0))  # 180 s, and one activity report
    assert stop_after == 180.0 + 1.1 * 30
    said = reclaim_notice(warned(), WARNED_AT + 10, stop_after)
    assert said == (
        "Idle while others wait for a GPU: this server stops at 2025-11-23T12:16:53Z unless you run a cell or save."
        " Save your work now."
    )  # an instant: the pages show it in the reader's own clock
    assert len(said) <= 140  # JupyterLab's notification shows no more
    # It stands past the announced time while the stop is under way (the warning must not leave first).
    assert reclaim_notice(warned(), WARNED_AT + stop_after + 5, stop_after) == said
    assert reclaim_notice(warned(), WARNED_AT + stop_after + 15, stop_after) is None  # stopped by now, or used again
    assert reclaim_notice(warned(), WARNED_AT - 1, stop_after) is None
    assert reclaim_notice(None, WARNED_AT, stop_after) is None
    stopping = ServerEvent("ann/", "stopping", 90, "the GPU line's reclaimer", WARNED_AT + 1)
    assert reclaim_notice(stopping, WARNED_AT + 2, stop_after) is None  # the last event is not the warning


def test_the_lead_is_three_minutes_or_a_third_of_a_short_timeout() -> None:
    assert (warning_lead(900), warning_lead(60)) == (180.0, 20.0)


def test_the_notice_lists_each_warned_server_of_the_user_once() -> None:
    spawners = {
        "": SimpleNamespace(gpu_reclaim_warning=lambda: ("Idle ...", WARNED_AT), gpu_warning_lead=180.0),
        "lab": SimpleNamespace(gpu_reclaim_warning=lambda: None, gpu_warning_lead=20.0),
        "other": SimpleNamespace(),  # a spawner without the GPU line (no such method): nothing
    }
    assert notices(spawners) == [{"server": "", "id": f"@{WARNED_AT}", "message": "Idle ...", "kind": "warning"}]
    assert next_look_s(spawners) == 20.0 / 6  # a sixth of the shortest lead
    assert next_look_s({"": SimpleNamespace(gpu_warning_lead=900.0)}) == 30.0  # at most every 30 s
    assert next_look_s({}) == 30.0


def test_the_home_warning_is_one_notice_whose_id_follows_its_words() -> None:
    assert home_notices(None) == []
    first, later = home_notices("takes 11 GiB"), home_notices("takes 12 GiB")
    assert len(first) == 1 and first[0]["message"] == "takes 11 GiB" and first[0]["server"] == ""
    assert first[0]["id"] != later[0]["id"] and first == home_notices("takes 11 GiB")


def test_the_reclaimers_stop_is_a_notice_of_its_own_for_the_next_jupyterlab() -> None:
    stopped_at = WARNED_AT + 213
    spawners = {
        "": SimpleNamespace(
            gpu_reclaim_warning=lambda: None,
            gpu_reclaim_stop=lambda: ("Stopped at ... by the GPU line's reclaimer: ...", stopped_at),
        )
    }
    assert notices(spawners) == [
        {
            "server": "",
            "id": f"stop:@{stopped_at}",  # one id per stop: JupyterLab shows it once, whatever reloads
            "message": "Stopped at ... by the GPU line's reclaimer: ...",
            "kind": "stop",
        }
    ]


@pytest.mark.parametrize(
    "reason,says",
    [
        (LEFT, "You seem to be away while others wait for a GPU: this server stops at 2025-11-23T12:16:53Z unless"),
        (RELEASED, "You seem to have left: this server stops at 2025-11-23T12:16:53Z to free its GPU, unless"),
    ],
)
def test_an_owner_who_seems_away_is_told_that_coming_back_keeps_the_server(reason: str, says: str) -> None:
    warning = ServerEvent(
        "ann/", "warned", 100, f"{WARNED[reason]}: stops at 2025-11-23T12:16:53Z unless used", WARNED_AT
    )
    said = reclaim_notice(warning, WARNED_AT + 10, 213.0)
    assert said is not None and said.startswith(says) and said.endswith("come back.")
    assert len(said) <= 140  # JupyterLab's notification shows no more
