"""The pure parts of the hub's GPU line API (hub/line_api.py); the handler runs in a real hub in
tests/kube/test_kube_line.py."""

import pytest

from hub.line_api import Drop, Move, Reserve, parse_action, viewer_of
from spawner.quotas import read_groups

GiB = 2**30


def test_actions_are_read_from_the_body() -> None:
    assert parse_action({"action": "put-first", "user": "bo", "server": ""}) == Move("put-first", "bo", "")
    assert parse_action({"action": "cancel", "user": "bo", "server": "gpu"}) == Move("cancel", "bo", "gpu")
    assert parse_action({"action": "reserve", "group": "ml101", "memory_bytes": 8 * GiB, "start": 1, "end": 2.5}) == (
        Reserve("ml101", 8 * GiB, 1.0, 2.5)
    )
    assert parse_action({"action": "drop-reservation", "id": 3}) == Drop(3)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (None, "send a JSON object"),
        ({"action": "jump"}, "unknown action 'jump'"),
        ({"action": "cancel", "user": 7}, "user must be a string"),
        ({"action": "drop-reservation", "id": "3"}, "id must be a whole number"),
        ({"action": "drop-reservation", "id": True}, "id must be a whole number"),
        ({"action": "reserve", "group": "a", "memory_bytes": 1, "start": "now", "end": 2}, "start must be a number"),
    ],
)
def test_a_bad_body_says_what_a_good_one_is(body: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_action(body)


def test_the_viewer_has_the_portals_scope_and_rights() -> None:
    rules = read_groups([{"name": "ml101", "teachers": ["tina"]}, {"name": "cv202"}])
    groups = {"ml101": ["bo"], "cv202": ["cy"]}
    scope, manager = viewer_of("tina", False, rules, groups)
    assert scope.sees("bo") and not scope.sees("cy")
    assert manager.classes == frozenset({"ml101"}) and not manager.admin
    scope, manager = viewer_of("bo", False, rules, groups)
    assert not scope.sees("cy") and not manager.classes
    scope, manager = viewer_of("root", True, rules, groups)
    assert scope.sees("cy") and manager.admin
