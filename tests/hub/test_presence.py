"""hub/presence.py: a server's presence report read, and put on the hub's clock.

(The handler on a real hub, with the server's own token and another's: tests/e2e/test_presence.py.)
"""

import pytest

from hub.presence import Report, presence_from, read_report
from spawner.waitline import Presence


def test_a_report_is_read_with_what_it_may_leave_out() -> None:
    body = {"pages": 1, "connections": 2, "busy": True, "input_s": 12.5, "page_s": 3}
    assert read_report(body) == Report(1, 2, True, 12.5, 3.0)
    assert read_report({}) == Report(0, 0, False, None, None)  # nothing open, never any input


@pytest.mark.parametrize(
    "body,says",
    [
        ([], "send a JSON object"),
        ({"pages": -1}, "pages must be a whole number from 0 to 1000"),
        ({"pages": True}, "pages must be a whole number"),
        ({"connections": 10**9}, "connections must be a whole number from 0 to 1000"),
        ({"busy": "yes"}, "busy must be true or false"),
        ({"input_s": "a minute"}, "input_s must be seconds ago"),
        ({"page_s": float("nan")}, "page_s must be seconds ago"),
        ({"input_s": float("inf")}, "input_s must be seconds ago"),
    ],
)
def test_a_bad_report_is_refused_saying_what_a_good_one_looks_like(body: object, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        read_report(body)
    assert '{"pages": 1' in str(refused.value)


def test_ages_become_instants_on_the_hubs_clock_never_later_than_the_receipt() -> None:
    received = 1_800_000_000.0
    report = Report(1, 1, False, input_s=30.0, page_s=-3600.0)  # "a page beat an hour from now"
    assert presence_from(report, received) == Presence(received, 1, 1, False, received - 30.0, received)
    forged = presence_from(Report(0, 0, False, input_s=-1e12, page_s=None), received)
    assert forged.last_input == received and forged.last_page is None  # the future is taken as now
