import re
from dataclasses import replace

import pytest

from spawner.quotas import GroupQuota, GroupRulesError, Usage, check, group_quota, group_rules, largest_slice, remaining
from spawner.shares import CPU_ONLY, GiB, GpuRequest

FOUR = GpuRequest(memory_bytes=4 * GiB)
CLASS = GroupQuota(
    "ml101",
    max_slice_bytes=4 * GiB,
    max_gpus=0,
    budget_bytes=40 * GiB,
    servers_per_user=1,
    allowed_images=frozenset({"pytorch"}),
)
STAFF = GroupQuota("staff", max_gpus=2)


def test_within_the_rules_is_allowed_and_charged_to_the_group() -> None:
    decision = check(FOUR, 4 * GiB, "pytorch", [CLASS], Usage())
    assert decision.allowed and decision.group == "ml101"
    assert str(decision) == "allowed under group 'ml101'"


def test_slice_too_big_names_the_rule_and_numbers() -> None:
    decision = check(GpuRequest(memory_bytes=8 * GiB), 8 * GiB, "pytorch", [CLASS], Usage())
    assert not decision.allowed and decision.rule == "slice"
    assert decision.reasons == ("Group 'ml101' allows slices up to 4 GiB; you asked for 8 GiB. Ask for 4 GiB or less.",)


def test_group_budget_counts_what_classmates_hold() -> None:
    usage = Usage(group_bytes={"ml101": 38 * GiB})
    decision = check(FOUR, 4 * GiB, "pytorch", [CLASS], usage)
    assert decision.rule == "budget"
    assert "GPU budget is 40 GiB and its members hold 38 GiB: 2 GiB left" in str(decision)
    assert "Ask for 2 GiB or less." in str(decision)
    spent = check(FOUR, 4 * GiB, "pytorch", [CLASS], Usage(group_bytes={"ml101": 40 * GiB}))
    assert "budget of 40 GiB is all in use by its members now. Wait for classmates" in str(spent)
    assert "0 B" not in str(spent)
    lab = GroupQuota("lab", budget_bytes=40 * GiB)
    whole_card = check(GpuRequest(gpus=1), 48 * GiB, "pytorch", [lab], Usage())
    assert str(whole_card) == "Group 'lab' has a GPU budget of 40 GiB in all, less than the 48 GiB you asked for."


def test_servers_per_user() -> None:
    decision = check(FOUR, 4 * GiB, "pytorch", [CLASS], Usage(user_servers=1))
    assert decision.rule == "servers"
    assert "allows 1 running server(s) per user and you have 1; stop one first." in str(decision)


def test_image_not_allowed() -> None:
    decision = check(FOUR, 4 * GiB, "tensorflow", [CLASS], Usage())
    assert decision.rule == "image"
    assert "does not allow image 'tensorflow' (allowed: pytorch)" in str(decision)


def test_whole_cards_limit() -> None:
    decision = check(GpuRequest(gpus=1), 16 * GiB, "pytorch", [CLASS], Usage())
    assert decision.rule == "gpus" and "allows no whole GPUs per server" in str(decision)
    decision = check(GpuRequest(gpus=3), 48 * GiB, None, [STAFF], Usage())
    assert "at most 2 whole GPU(s) per server; you asked for 3" in str(decision)


def test_any_group_of_the_user_may_grant_and_refusals_list_every_group() -> None:
    assert check(GpuRequest(gpus=1), 16 * GiB, "pytorch", [CLASS, STAFF], Usage()).group == "staff"
    refused = check(GpuRequest(gpus=3), 48 * GiB, "pytorch", [CLASS, STAFF], Usage())
    assert len(refused.reasons) == 2 and refused.rule == "gpus"


def test_users_in_no_group_are_unlimited_and_cpu_only_needs_no_budget() -> None:
    assert check(GpuRequest(gpus=8), 640 * GiB, None, [], Usage()).allowed
    assert check(CPU_ONLY, 0, "pytorch", [CLASS], Usage(group_bytes={"ml101": 40 * GiB})).allowed


def test_remaining_and_largest_slice_for_the_form() -> None:
    usage = Usage(group_bytes={"ml101": 38 * GiB})
    assert remaining(CLASS, usage) == 2 * GiB
    assert remaining(STAFF, usage) is None
    assert largest_slice([CLASS], usage, 16 * GiB) == 2 * GiB
    assert largest_slice([CLASS, STAFF], usage, 16 * GiB) == 16 * GiB
    assert largest_slice([CLASS], Usage(user_servers=1), 16 * GiB) == 0


def test_group_rules_are_read_the_same_from_settings_and_from_the_chart() -> None:
    settings = {"name": "ml101", "max_slice": "4GiB", "max_gpus": 0, "budget": "40GiB", "servers_per_user": 1}
    chart = {"name": "ml101", "maxSlice": "4GiB", "maxGpus": 0, "budget": "40GiB", "serversPerUser": 1}
    assert group_quota(settings) == group_quota(chart) == replace(CLASS, allowed_images=None)
    assert group_rules("ml101", {"maxSlice": "4GiB", "profiles": ["t4"]}) == {
        "max_slice": "4GiB",
        "profiles": ["t4"],
        "members": [],
    }


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"maxSlice": "big"}, "groups.g.max_slice: 'big' is not an amount of memory"),
        ({"servers_per_user": True}, "groups.g.servers_per_user must be a whole number"),
        ({"members": "alice"}, "groups.g.members must be a list of user names"),
        ({"budjet": "4GiB"}, "groups.g: unknown key(s) budjet (did you mean budget?)"),
        (["max_slice"], "groups.g must be a mapping of rules"),
    ],
)
def test_bad_group_rules_say_which(rules: object, message: str) -> None:
    with pytest.raises(GroupRulesError, match=re.escape(message)):
        group_rules("g", rules)  # type: ignore[arg-type]
