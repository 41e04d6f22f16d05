import re
from dataclasses import replace

import pytest

from spawner.quotas import (
    DEFAULT_RULES,
    GroupQuota,
    GroupRulesError,
    Usage,
    budgets,
    check,
    largest_slice,
    read_group,
    read_groups,
    remaining,
    rules_for,
)
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
    assert "allows 1 running server per user and you have 1; stop one first." in str(decision)


def test_image_not_allowed() -> None:
    decision = check(FOUR, 4 * GiB, "tensorflow", [CLASS], Usage())
    assert decision.rule == "image"
    assert "does not allow image 'tensorflow' (allowed: pytorch)" in str(decision)


def test_whole_cards_limit() -> None:
    decision = check(GpuRequest(gpus=1), 16 * GiB, "pytorch", [CLASS], Usage())
    assert decision.rule == "gpus" and "allows no whole GPUs per server" in str(decision)
    decision = check(GpuRequest(gpus=3), 48 * GiB, None, [STAFF], Usage())
    assert "at most 2 whole GPUs per server; you asked for 3" in str(decision)


def test_any_group_of_the_user_may_grant_and_refusals_list_every_group() -> None:
    assert check(GpuRequest(gpus=1), 16 * GiB, "pytorch", [CLASS, STAFF], Usage()).group == "staff"
    refused = check(GpuRequest(gpus=3), 48 * GiB, "pytorch", [CLASS, STAFF], Usage())
    assert len(refused.reasons) == 2 and refused.rule == "gpus"


def test_users_in_no_group_get_the_finite_default_rules() -> None:
    """A second account made outside a class gets no whole card and no big slice (nothing unlimited)."""
    whole = check(GpuRequest(gpus=1), 16 * GiB, None, [], Usage())
    assert not whole.allowed and whole.rule == "gpus" and "Group 'default' allows no whole GPUs" in str(whole)
    big = check(GpuRequest(memory_bytes=8 * GiB), 8 * GiB, None, [], Usage())
    assert not big.allowed and "Group 'default' allows slices up to 4 GiB" in str(big)
    assert check(FOUR, 4 * GiB, None, [], Usage()).group == "default"
    assert check(FOUR, 4 * GiB, None, [], Usage(user_servers=1)).rule == "servers"
    spent = check(FOUR, 4 * GiB, None, [], Usage(group_bytes={"default": 14 * GiB}))
    assert spent.rule == "budget" and "GPU budget is 16 GiB" in str(spent)
    assert largest_slice([], Usage(), 80 * GiB) == 4 * GiB
    quota = DEFAULT_RULES.quota
    assert None not in (quota.max_slice_bytes, quota.max_gpus, quota.budget_bytes, quota.servers_per_user)


def test_cpu_only_needs_no_budget() -> None:
    assert check(CPU_ONLY, 0, "pytorch", [CLASS], Usage(group_bytes={"ml101": 40 * GiB})).allowed


def test_the_settings_may_change_the_default_rules_and_keep_the_rest() -> None:
    groups = read_groups({"ml101": {"members": ["ann"], "max_slice": "8GiB"}, "default": {"max_slice": "2GiB"}})
    kim = rules_for(["staff"], groups)  # a JupyterHub group with no rules counts as none
    assert [r.name for r in kim] == ["default"]
    assert kim[0].quota == GroupQuota(
        "default", max_slice_bytes=2 * GiB, max_gpus=0, budget_bytes=16 * GiB, servers_per_user=1
    )
    assert [r.name for r in rules_for(["ml101", "staff"], groups)] == ["ml101"]
    assert [r.name for r in rules_for([], ())] == ["default"] and rules_for([], ())[0] == DEFAULT_RULES
    assert budgets(groups) == {"ml101": None, "default": 16 * GiB}
    with pytest.raises(GroupRulesError, match=r"groups.default.members must be empty"):
        read_group("default", {"members": ["kim"]})


def test_remaining_and_largest_slice_for_the_form() -> None:
    usage = Usage(group_bytes={"ml101": 38 * GiB})
    assert remaining(CLASS, usage) == 2 * GiB
    assert remaining(STAFF, usage) is None
    assert largest_slice([CLASS], usage, 16 * GiB) == 2 * GiB
    assert largest_slice([CLASS, STAFF], usage, 16 * GiB) == 16 * GiB
    assert largest_slice([CLASS], Usage(user_servers=1), 16 * GiB) == 0


def test_group_rules_are_read_the_same_from_settings_and_from_the_chart() -> None:
    settings = {"max_slice": "4GiB", "max_gpus": 0, "budget": "40GiB", "servers_per_user": 1}
    chart = {"maxSlice": "4GiB", "maxGpus": 0, "budget": "40GiB", "serversPerUser": 1}
    z2jh = [{"name": "ml101", **settings}]  # KubeGpuSpawner.gpu_groups: a list of rules with a name
    assert read_group("ml101", settings) == read_group("ml101", chart) == read_groups(z2jh)[0]
    assert read_group("ml101", chart).quota == replace(CLASS, allowed_images=None)
    rules = read_group("ml101", {"maxSlice": "4GiB", "profiles": ["t4"]})
    assert (rules.max_slice, rules.profiles, rules.members, rules.budget) == ("4GiB", ("t4",), (), None)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"maxSlice": "big"}, "groups.g.max_slice: 'big' is not an amount of memory"),
        ({"servers_per_user": True}, "groups.g.servers_per_user must be a whole number"),
        ({"members": "alice"}, "groups.g.members must be a list of user names"),
        ({"budjet": "4GiB"}, "groups.g: unknown key(s) budjet (did you mean budget?)"),
        (["max_slice"], "groups.g must be a mapping of rules"),
        ({"max_gpus": "two"}, "groups.g.max_gpus must be a whole number"),
        ({"images": "torch"}, "groups.g.images must be a list of names"),
        ({"maxHold": "2 days"}, "groups.g.max_hold must be a duration such as 2h, 90min or 3600 (seconds)"),
        ({"max_hold": 0}, "groups.g.max_hold must be a duration"),
        ({"max_hold": True}, "groups.g.max_hold must be a duration"),
        ({"lineOrder": "fifo"}, "groups.g.line_order must be one of round-robin, least-served, not 'fifo'"),
    ],
)
def test_bad_group_rules_say_which(rules: object, message: str) -> None:
    with pytest.raises(GroupRulesError, match=re.escape(message)):
        read_group("g", rules)


@pytest.mark.parametrize(("written", "seconds"), [("2h", 7200.0), ("90min", 5400.0), ("45 s", 45.0), (3600, 3600.0)])
def test_a_classs_max_hold_is_read_in_hours_minutes_or_seconds(written: object, seconds: float) -> None:
    assert read_group("ml101", {"maxHold": written}).quota.max_hold_s == seconds
    assert read_group("ml101", {}).quota.max_hold_s is None  # no cap unless the class sets one


def test_a_budget_may_be_written_in_slices_and_says_of_what_size() -> None:
    assert read_group("ml101", {"max_slice": "4GiB", "budget": "2 slices"}).quota.budget_bytes == 8 * GiB
    assert read_group("ml101", {"budget": "3 slices of 2 GiB"}).quota.budget_bytes == 6 * GiB
    with pytest.raises(GroupRulesError, match=r"says how many slices but not of what size.*or set max_slice"):
        read_group("ml101", {"budget": "2 slices"})
    with pytest.raises(GroupRulesError, match=r"groups.ml101.budget"):
        read_group("ml101", {"budget": "2 slices of lots"})


def test_a_class_chooses_its_lines_order_round_robin_unless_it_says_least_served() -> None:
    from spawner.quotas import least_served_groups

    groups = [read_group("ml101", {"lineOrder": "least-served"}), read_group("cv202", {})]
    assert least_served_groups(groups) == frozenset({"ml101"})
