"""What the classes API (hub/classes_api.py) lets whom change, from literal bodies and rules.

The handler in a running hub: tests/e2e/test_class_flow.py (the portal's teacher page and
`gpuslice class add` against a running platform)."""

import pytest

from hub.classes_api import apply, may_change, parse_action, visible

ML101 = {"name": "ml101", "members": ["ann", "bo"], "teachers": ["tina"], "max_slice": "4GiB"}


def test_a_teacher_changes_the_roster_of_their_class_only_and_admins_anything() -> None:
    add = parse_action({"action": "add-members", "name": "ml101", "members": [" Cy ", "cy", "dee"]})
    assert add.members == ("cy", "dee")
    assert may_change("tina", False, add, ML101) is None
    assert apply(add, ML101) == {**ML101, "members": ["ann", "bo", "cy", "dee"]}
    assert "only admins and its teachers" in (may_change("bo", False, add, ML101) or "")
    new = parse_action({"action": "add-class", "name": "cv202", "rules": {"budget": "2 slices of 4GiB"}})
    assert "only admins can" in (may_change("tina", False, new, None) or "")
    assert may_change("root", True, new, None) is None
    assert apply(new, None) == {"budget": "2 slices of 4GiB", "members": []}
    gone = parse_action({"action": "remove-members", "name": "ml101", "members": ["bo"]})
    assert apply(gone, ML101) == {**ML101, "members": ["ann"]}
    assert visible("tina", False, [ML101, {"name": "cv202"}]) == [ML101]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([], "JSON object"),
        ({"action": "destroy", "name": "ml101"}, "unknown action"),
        ({"action": "add-class", "name": "ML 101"}, "class name"),
        ({"action": "add-class", "name": "ml101", "rules": {"members": ["x"]}}, "rules may set"),
        ({"action": "add-members", "name": "ml101", "members": ["<script>"]}, "is not a user name"),
    ],
)
def test_a_bad_body_says_what_a_good_one_is(body: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_action(body)


def test_a_class_that_is_not_there_or_already_there_is_said_so() -> None:
    with pytest.raises(ValueError, match="already a class ml101"):
        apply(parse_action({"action": "add-class", "name": "ml101"}), ML101)
    with pytest.raises(ValueError, match="no class cv202"):
        apply(parse_action({"action": "add-members", "name": "cv202", "members": ["x"]}), None)
