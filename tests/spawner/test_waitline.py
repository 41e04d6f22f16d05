"""The waiting line's order and admissions, from literal inputs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, Inventory, build_local
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import (
    Entry,
    GpuTrace,
    Holder,
    Manager,
    Reservation,
    Wait,
    WaitStats,
    activity_report_interval,
    admit,
    budget_holding_back,
    busy_alone,
    busy_processes,
    estimated_start,
    fair_order,
    follow_gpu_memory,
    kept_for_others,
    may_manage,
    never_fits,
    percentile,
    positions,
    put_first,
    reclaim,
    reservation_problem,
    sees_wait,
    stop_due,
    wait_stats,
    with_gpu_activity,
)

TWO_CARDS = simulated_gpus("2x16GiB:T4")


def entry(key: str, arrived: float, gib: int = 4, group: str | None = None, priority: int = 0) -> Entry:
    user = key.split("/")[0]
    demand = Demand(slice_units=float(gib * GiB))
    return Entry(key, user, demand, gib * GiB, group, arrived, priority, seen=arrived)


def machine(held: dict[str, tuple[int, int]]) -> Inventory:
    """The two simulated cards with ``held``: key -> (GPU index, GiB)."""
    allocations = [(gpu, Allocation(k.split("/")[0], "", gib * GiB, k)) for k, (gpu, gib) in held.items()]
    return build_local(TWO_CARDS, allocations)


def full_machine() -> Inventory:
    return machine({f"u{i}/": (i % 2, 4) for i in range(8)})


def test_round_robin_between_users_then_arrival() -> None:
    line = [entry("ann/a", 1), entry("ann/b", 2), entry("bob/", 3), entry("cy/", 4)]
    assert [e.key for e in fair_order(line)] == ["ann/a", "bob/", "cy/", "ann/b"]


def test_a_user_already_holding_a_server_goes_after_those_holding_none() -> None:
    line = [entry("ann/", 1), entry("bob/", 2)]
    assert [e.key for e in fair_order(line, {"ann": 1})] == ["bob/", "ann/"]


def test_put_first_beats_arrival_and_fair_share() -> None:
    line = put_first([entry("ann/", 1), entry("bob/", 2), entry("cy/", 3)], "cy/")
    assert positions(line) == {"cy/": 1, "ann/": 2, "bob/": 3}


def test_nothing_is_admitted_while_the_cards_are_full() -> None:
    line = [entry("ann/", 1), entry("bob/", 2)]
    assert admit(line, full_machine(), budgets={}, group_bytes={}, now=10) == []


def test_one_free_slice_goes_to_the_first_in_line_only() -> None:
    held = {f"u{i}/": (i % 2, 4) for i in range(7)}  # one 4 GiB slice free on GPU 1
    line = [entry("bob/", 2), entry("ann/", 1)]
    admitted = admit(line, machine(held), budgets={}, group_bytes={}, now=10)
    assert [(a.entry.key, a.choice.gpus) for a in admitted] == [("ann/", (1,))]


def test_admissions_never_share_memory() -> None:
    held = {f"u{i}/": (i % 2, 4) for i in range(6)}  # 4 GiB free on each card
    line = [entry(f"s{i}/", i) for i in range(5)]
    admitted = admit(line, machine(held), budgets={}, group_bytes={}, now=10)
    assert sorted(a.choice.gpus for a in admitted) == [(0,), (1,)]


def test_the_first_that_does_not_fit_blocks_those_behind_it() -> None:
    held = {f"u{i}/": (i % 2, 4) for i in range(6)}  # 4 GiB free on each card
    line = [entry("big/", 1, gib=8), entry("small/", 2, gib=4)]
    assert admit(line, machine(held), budgets={}, group_bytes={}, now=10) == []


def test_a_group_over_budget_waits_and_other_groups_go_ahead() -> None:
    line = [entry("ann/", 1, group="a"), entry("amy/", 2, group="a"), entry("bob/", 3, group="b")]
    admitted = admit(line, machine({}), budgets={"a": 8 * GiB}, group_bytes={"a": 4 * GiB}, now=10)
    assert [a.entry.key for a in admitted] == ["ann/", "bob/"]


def test_an_entry_not_seen_for_a_while_keeps_its_place_but_does_not_block() -> None:
    held = {f"u{i}/": (i % 2, 4) for i in range(7)}
    line = [entry("gone/", 1), entry("here/", 190)]
    admitted = admit(line, machine(held), budgets={}, group_bytes={}, now=200)
    assert [a.entry.key for a in admitted] == ["here/"]
    assert positions(line)["gone/"] == 1


def test_requests_that_could_never_fit_are_named() -> None:
    assert never_fits(entry("ann/", 1, gib=32), machine({}), {}) is not None
    assert "budget" in (never_fits(entry("ann/", 1, gib=8, group="a"), machine({}), {"a": 4 * GiB}) or "")
    assert never_fits(entry("ann/", 1, gib=8), full_machine(), {}) is None


def test_estimated_start_is_when_enough_servers_have_ended() -> None:
    assert estimated_start(2, [300.0, 100.0, 200.0], now=150.0) == 200.0
    assert estimated_start(1, [100.0], now=150.0) == 150.0
    assert estimated_start(3, [100.0], now=0.0) is None


# One step: ("arrive", user, GiB) or ("leave", index of a running server).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 5), st.sampled_from([2, 4, 8, 16])),
        st.tuples(st.just("leave"), st.integers(0, 40), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.sampled_from([None, 24]))
def test_no_sequence_over_commits_and_everyone_waiting_is_served(
    ops: list[tuple[str, int, int]], budget: int | None
) -> None:
    running: dict[str, tuple[int, int]] = {}  # key -> (GPU index, GiB)
    line: list[Entry] = []
    budgets = {"class": None if budget is None else budget * GiB}
    clock = 0.0

    def step() -> None:
        group_bytes = {"class": sum(gib for _, gib in running.values()) * GiB}
        held_by_user: dict[str, int] = {}
        for key in running:
            held_by_user[key.split("/")[0]] = held_by_user.get(key.split("/")[0], 0) + 1
        fresh = [Entry(e.key, e.user, e.demand, e.asked_bytes, e.group, e.arrived, seen=clock) for e in line]
        for a in admit(
            fresh, machine(running), budgets=budgets, group_bytes=group_bytes, held_by_user=held_by_user, now=clock
        ):
            running[a.entry.key] = (a.choice.gpus[0], a.entry.asked_bytes // GiB)
            line[:] = [e for e in line if e.key != a.entry.key]
        for gpu in (0, 1):  # checked against the cards directly, not through the line's own arithmetic
            assert sum(gib for g, gib in running.values() if g == gpu) <= 16
        assert sum(gib for _, gib in running.values()) * GiB <= (budgets["class"] or 1 << 60)

    for n, (kind, who, gib) in enumerate(ops):
        clock += 1
        if kind == "arrive":
            line.append(entry(f"u{who}/{n}", clock, gib=gib, group="class"))
        elif running:
            del running[sorted(running)[who % len(running)]]
        step()
    while line:  # everyone leaves in turn: the line must empty
        clock += 1
        before = len(line)
        if running:
            del running[sorted(running)[0]]
        step()
        assert running or len(line) < before, f"stuck with nothing running: {line}"


def test_reclaiming_takes_only_gpu_servers_idle_on_both_counts_longest_first_and_only_what_the_line_needs() -> None:
    from spawner.waitline import Holder, reclaim

    holders = [
        Holder("cpu/", False, 0.0, 0.0),  # no GPU: never reclaimed for the line
        Holder("busy-kernel/", True, None, 0.0),
        Holder("busy-gpu/", True, 0.0, None),  # kernels idle, but its processes use the GPU
        Holder("old/", True, 0.0, 100.0),  # idle since 100
        Holder("older/", True, 0.0, 50.0),
        Holder("soon/", True, 0.0, 300.0),  # 14 min idle at 1140: warned
    ]
    assert reclaim(holders, waiting=1, now=1140.0) == ([], ["older/"])  # soon/'s owner is not told of no stop
    assert reclaim(holders, waiting=2, now=1140.0) == ([], ["older/", "old/"])
    assert reclaim(holders, waiting=5, now=1140.0) == (["soon/"], ["older/", "old/"])
    assert reclaim(holders, waiting=1, now=900.0) == (["older/"], [])  # old/ is idle too: only the one needed is warned
    assert reclaim(holders, waiting=0, now=1140.0) == ([], [])  # nobody waits: the normal idle timeout


def test_admins_manage_anything_teachers_only_their_class_students_nothing() -> None:
    admin, teacher, student = Manager("root", admin=True), Manager("tom", classes=frozenset({"ml101"})), Manager("sam")
    assert may_manage(admin, None) is None and may_manage(admin, "cv202") is None
    assert may_manage(teacher, "ml101") is None
    assert may_manage(teacher, "cv202") == "tom teaches ml101, not cv202: only an admin may change this request"
    assert may_manage(teacher, None) == (
        "tom teaches ml101, not the class of this request: only an admin may change this request"
    )
    assert may_manage(student, "ml101") == (
        "sam may not change the GPU line: only admins and the teachers of a class can"
    )


def test_a_reservation_keeps_its_memory_from_other_classes_while_it_is_on() -> None:
    held = {f"u{i}/": (i % 2, 4) for i in range(4)}  # 8 GiB free on each card: 16 GiB
    kept = [Reservation("ml101", 12 * GiB, start=100, end=200)]
    line = [entry("out/", 141, group="cv202"), entry("in/", 142, group="ml101"), entry("in2/", 143, group="ml101")]
    during = admit(line, machine(held), budgets={}, group_bytes={}, now=150, reservations=kept)
    assert [a.entry.key for a in during] == ["out/", "in/", "in2/"]  # 4 for others, then the class's 12
    more = [entry("out/", 201, group="cv202"), entry("out2/", 202, group="cv202"), entry("in/", 203, group="ml101")]
    kept = [Reservation("ml101", 12 * GiB, start=100, end=210)]
    during = admit(more, machine(held), budgets={}, group_bytes={}, now=205, reservations=kept)
    assert [a.entry.key for a in during] == ["out/", "in/"]  # out2 would eat the class's memory
    after = admit(more, machine(held), budgets={}, group_bytes={}, now=210, reservations=kept)
    assert [a.entry.key for a in after] == ["out/", "out2/", "in/"]


def test_what_a_class_already_holds_counts_towards_its_reservation() -> None:
    kept = [Reservation("ml101", 8 * GiB, 0, 10), Reservation("ml101", 4 * GiB, 0, 10), Reservation("x", 4, 20, 30)]
    assert kept_for_others(kept, "cv202", {"ml101": 4 * GiB}, now=5) == 8 * GiB
    assert kept_for_others(kept, "ml101", {}, now=5) == 0
    assert kept_for_others(kept, None, {"ml101": 16 * GiB}, now=5) == 0


def test_reservations_never_promise_more_than_the_machine_has() -> None:
    made = [Reservation("a", 16 * GiB, 0, 100), Reservation("b", 8 * GiB, 50, 150)]
    assert reservation_problem(Reservation("c", 8 * GiB, 0, 50), made, 32 * GiB) is None
    assert reservation_problem(Reservation("c", 8 * GiB, 150, 200), made, 32 * GiB) is None
    assert reservation_problem(Reservation("c", 16 * GiB, 100, 200), made, 32 * GiB) is None
    assert reservation_problem(Reservation("c", 16 * GiB, 60, 70), made, 32 * GiB) == (
        "with the reservations already made this would keep 40 GiB at once, more than the 32 GiB"
        " of GPU memory here: reserve less or another time"
    )
    assert reservation_problem(Reservation("c", 16 * GiB, 40, 60), made, 32 * GiB) is not None  # b starts inside
    assert reservation_problem(Reservation("c", 0, 0, 1), [], 32 * GiB) == (
        "reserve a positive amount of GPU memory, for example 8GiB"
    )
    assert reservation_problem(Reservation("c", GiB, 5, 5), [], 32 * GiB) == "the window must end after it starts"


DAY = 1_763_856_000.0  # 2025-11-23 00:00 UTC


def test_percentiles_are_nearest_rank() -> None:
    ten = [float(s) for s in (9, 1, 8, 2, 7, 3, 6, 4, 5, 10)]
    assert (percentile(ten, 50), percentile(ten, 95), percentile(ten, 100)) == (5.0, 10.0, 10.0)
    assert percentile([30.0], 50) == 30.0 and percentile([10.0, 20.0], 50) == 10.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_wait_stats_per_class_and_day_count_those_who_left_for_as_long_as_they_waited() -> None:
    waits = [
        Wait("ann/", "ann", "ml101", DAY + 600, DAY + 660, "placed"),  # 1 min
        Wait("bo/", "bo", "ml101", DAY + 700, DAY + 1000, "placed"),  # 5 min
        Wait("cy/", "cy", "ml101", DAY + 800, DAY + 2600, "left"),  # 30 min, then gave up
        Wait("di/", "di", "cv202", DAY + 900, DAY + 960, "cancelled"),
        Wait("ed/", "ed", None, DAY + 1000, DAY + 1010, "placed"),
        Wait("ann/", "ann", "ml101", DAY + 86400 + 5, DAY + 86400 + 125, "placed"),  # the next day
        Wait("late/", "late", "ml101", DAY + 86399, DAY + 86400 + 99, "placed"),  # 100 s, began the day before
    ]
    assert wait_stats(waits) == [
        WaitStats("2025-11-24", "ml101", 1, 1, 120.0, 120.0, 120.0),
        WaitStats("2025-11-23", "cv202", 1, 0, 60.0, 60.0, 60.0),
        WaitStats("2025-11-23", "ml101", 4, 3, 100.0, 1800.0, 1800.0),  # 60, 100, 300, 1800 s
        WaitStats("2025-11-23", None, 1, 1, 10.0, 10.0, 10.0),
    ]
    assert wait_stats([]) == []


def test_admins_see_every_waits_teachers_their_classes_students_their_own() -> None:
    waits = [Wait(f"{u}/", u, g, 0, 1, "placed") for u, g in (("ann", "ml101"), ("bo", "cv202"), ("tom", None))]

    def seen(m: Manager) -> list[str]:
        return [w.user for w in waits if sees_wait(m, w)]

    assert seen(Manager("root", admin=True)) == ["ann", "bo", "tom"]
    assert seen(Manager("tom", classes=frozenset({"ml101"}))) == ["ann", "tom"]
    assert seen(Manager("bo")) == ["bo"]
    assert seen(Manager("cy")) == []


MiB = 2**20


def test_gpu_memory_that_moves_is_a_change_a_little_drift_is_not_until_it_adds_up() -> None:
    first = follow_gpu_memory({}, {"ann/": 1000 * MiB, "bo/": 0}, now=100)
    assert first == {"ann/": GpuTrace(1000 * MiB, None), "bo/": GpuTrace(0, None)}  # nothing known yet
    second = follow_gpu_memory(first, {"ann/": 1010 * MiB, "bo/": 2000 * MiB}, now=130)
    assert second == {"ann/": GpuTrace(1000 * MiB, None), "bo/": GpuTrace(2000 * MiB, 130)}
    third = follow_gpu_memory(second, {"ann/": 1020 * MiB, "bo/": 0}, now=160)  # ann crept 20 MiB; bo freed all
    assert third == {"ann/": GpuTrace(1020 * MiB, 160), "bo/": GpuTrace(0, 160)}
    assert follow_gpu_memory(third, {}, now=190) == {}  # servers gone are forgotten


def test_a_busy_card_counts_for_the_one_server_alone_on_it_only() -> None:
    cards = [(80.0, ["ann/", "ann/"]), (90.0, ["bo/", "cy/"]), (1.0, ["di/"]), (50.0, [])]
    assert busy_alone(cards) == {"ann/"}


def test_the_gpus_evidence_keeps_a_server_whose_kernels_look_idle_from_being_reclaimed() -> None:
    hub_says = [Holder(k, True, 0.0, 0.0) for k in ("ann/", "bo/", "cy/", "di/")]
    traces = {"bo/": GpuTrace(4 * GiB, 950.0), "cy/": GpuTrace(4 * GiB, None), "di/": GpuTrace(0, 10.0)}
    joined = with_gpu_activity(hub_says, traces, busy={"ann/"})
    assert [h.gpu_idle_since for h in joined] == [None, 950.0, 0.0, 10.0]
    warn, stop = reclaim(joined, waiting=4, now=1000.0, gpu_idle_timeout=900, warn_before=180)
    assert stop == ["cy/", "di/"] and warn == []  # ann computes now, bo's memory moved 50 s ago
    assert reclaim(hub_says, waiting=4, now=1000.0, gpu_idle_timeout=900)[1] == ["ann/", "bo/", "cy/", "di/"]


def test_servers_report_activity_well_within_the_warning_and_never_less_often_than_jupyterhubs_default() -> None:
    assert activity_report_interval(180) == 30  # the default warning: a sixth of it
    assert activity_report_interval(20) == 3
    assert activity_report_interval(3) == 1  # never 0: JupyterHub would turn the reports off
    assert activity_report_interval(3600) == 300  # never rarer than JupyterHub's own default


def test_a_warned_server_is_stopped_only_after_a_use_before_the_announced_time_would_have_been_reported() -> None:
    # Warned at 1000 for a stop "at 1180 unless used"; servers report every 30 s (+10 % jitter).
    assert not stop_due(1000.0, 1180.0, 180.0, 30)  # a use at 1179 may reach the hub only at 1212
    assert not stop_due(1000.0, 1212.9, 180.0, 30)
    assert stop_due(1000.0, 1213.0, 180.0, 30)


def test_a_server_is_gpu_busy_when_any_of_its_processes_ran_kernels_since_the_last_look() -> None:
    assert busy_processes({"ann/": 41.0, "bo/lab": 4.9, "cy/": 0.0, "di/": 5.0}) == {"ann/", "di/"}


def test_a_slice_stopped_for_the_line_counts_as_on_its_way_until_the_hub_is_done_and_one_grace_after() -> None:
    from spawner.waitline import still_freeing

    stopped = {"ann/": 100.0}
    assert still_freeing(stopped, {"ann/"}, now=160.0, grace_s=20) == {"ann/": 160.0}  # the pod is still going
    assert still_freeing({"ann/": 160.0}, set(), now=175.0, grace_s=20) == {"ann/": 160.0}  # gone: the spawn looks
    assert still_freeing({"ann/": 160.0}, set(), now=181.0, grace_s=20) == {}  # the line had its chance


def test_a_class_over_its_budget_is_named_and_a_class_within_it_is_not() -> None:
    assert budget_holding_back(entry("amy/", 1, group="a"), {"a": 8 * GiB}, {"a": 8 * GiB}) == "a"
    assert budget_holding_back(entry("amy/", 1, group="a"), {"a": 8 * GiB}, {"a": 4 * GiB}) is None
    assert budget_holding_back(entry("bob/", 1), {"a": 8 * GiB}, {"a": 8 * GiB}) is None  # no class
    assert budget_holding_back(entry("cy/", 1, group="c"), {"a": 8 * GiB}, {}) is None  # no budget


def test_while_others_wait_a_slice_held_past_its_classs_max_hold_is_warned_then_stopped_however_busy() -> None:
    from spawner.waitline import over_hold

    busy = None  # a kernel busy now: idleness would never free these
    holders = [
        Holder("ann/", True, busy, busy, held_since=0.0, max_hold_s=3600),  # 400 s past her class's hour
        Holder("bo/", True, busy, busy, held_since=3200.0, max_hold_s=900),  # 100 s to go: warned
        Holder("cy/", True, busy, busy, held_since=3500.0, max_hold_s=3600),  # far from it
        Holder("di/", True, busy, busy, held_since=0.0, max_hold_s=None),  # a class without a cap
        Holder("ed/", False, busy, busy, held_since=0.0, max_hold_s=60),  # no GPU: nothing to give the line
        Holder("fy/", True, busy, busy, held_since=None, max_hold_s=60),  # placement not known: not guessed
    ]
    assert over_hold(holders, waiting=5, now=4000.0, warn_before=180) == (["bo/"], ["ann/"])
    assert over_hold(holders, waiting=1, now=4000.0, warn_before=180) == ([], ["ann/"])  # longest past first
    assert over_hold(holders, waiting=0, now=4000.0, warn_before=180) == ([], [])  # nobody waits
