from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, Inventory, Node, build_local
from spawner.placement import (
    POLICIES,
    BestFit,
    Choice,
    ClusterState,
    DefaultPolicy,
    Demand,
    DotProduct,
    FragmentationGradientDescent,
    RandomFit,
    Spread,
    Workload,
    WorkloadArrays,
    bound_demand_per_free_card,
    expected_overflow,
    explain,
    fragmentation,
    known_workload,
    make_policy,
    type_capacity,
    type_fragment,
)
from spawner.placement.fragmentation import DistinctGpus, FitParts, distinct_gpus, host_only_after
from spawner.placement.remembered import TypeValues
from spawner.shares import GiB, GpuRequest


def state(nodes: Sequence[Sequence[float]], cpu: Sequence[float] | None = None, model: str = "T4") -> ClusterState:
    """Nodes of 1000-unit cards with the given free amounts."""
    return ClusterState(
        [f"n{i}" for i in range(len(nodes))],
        cpu or [64000] * len(nodes),
        [256 * GiB] * len(nodes),
        [[1000.0] * len(free) for free in nodes],
        [[model] * len(free) for free in nodes],
        gpu_free=[list(free) for free in nodes],
    )


def slice_(share: float, cpu: int = 0) -> Demand:
    return Demand(cpu_milli=cpu, slice_fraction=share)


HALVES = Workload((slice_(0.5),), (1.0,))


def frag(s: ClusterState, wl: Workload, cpu_tasks_fragment: bool = True) -> list[float]:
    arrays = WorkloadArrays.build(wl, s.model_names)
    return list(
        fragmentation(arrays, s.free, s.cap, s.model, s.usable, s.cpu, s.mem, cpu_tasks_fragment=cpu_tasks_fragment)
    )


def test_fragmentation_counts_free_memory_too_small_for_the_workload() -> None:
    # Against half-card tasks: 300 of 1000 free is a fragment, 600 is not.
    assert frag(state([[1000, 300], [600, 0]]), HALVES) == pytest.approx([0.3, 0.0])


def test_fragmentation_is_all_free_gpu_when_the_task_cannot_fit_at_all() -> None:
    cpu_hungry = Workload((slice_(0.5, cpu=8000),), (1.0,))
    assert frag(state([[1000, 300]], cpu=[4000]), cpu_hungry) == pytest.approx([1.3])
    other_model = Workload((Demand(slice_fraction=0.5, models=frozenset({"V100"})),), (1.0,))
    assert frag(state([[1000, 300]]), other_model) == pytest.approx([1.3])


def test_fragmentation_for_whole_card_tasks_is_every_partly_used_card() -> None:
    whole = Workload((Demand(gpus=1),), (1.0,))
    assert frag(state([[1000, 300, 999]]), whole) == pytest.approx([1.299])
    two = Workload((Demand(gpus=2),), (1.0,))
    assert frag(state([[1000, 300]]), two) == pytest.approx([1.3])  # cannot fit: all of it


def test_fragmentation_weights_task_types_by_popularity() -> None:
    wl = Workload((slice_(0.5), Demand(gpus=1)), (0.75, 0.25))
    assert frag(state([[1000, 300]]), wl) == pytest.approx([0.75 * 0.3 + 0.25 * 0.3])


def test_cpu_only_tasks_count_all_free_gpu_in_fgd_but_not_in_default_when_they_fit() -> None:
    wl = Workload((Demand(cpu_milli=1000),), (1.0,))
    s = state([[1000, 300]], cpu=[4000])
    assert frag(s, wl, cpu_tasks_fragment=True) == pytest.approx([1.3])
    assert frag(s, wl, cpu_tasks_fragment=False) == pytest.approx([0.0])
    assert frag(state([[1000, 300]], cpu=[500]), wl, cpu_tasks_fragment=False) == pytest.approx([1.3])


def test_fgd_keeps_room_for_the_common_task_where_best_fit_does_not() -> None:
    s = state([[600, 700]])
    # best-fit fills the fuller card (leaving 400: too small for a half card);
    # FGD takes from the emptier one so both keep room for a half card.
    assert BestFit().choose(s, slice_(0.2)) == Choice(0, (0,))
    assert FragmentationGradientDescent(HALVES).choose(s, slice_(0.2)) == Choice(0, (1,))


def test_fgd_avoids_the_node_whose_cpu_it_would_exhaust() -> None:
    wl = Workload((slice_(0.5, cpu=4000),), (1.0,))
    s = state([[1000], [1000]], cpu=[4000, 16000])
    assert FragmentationGradientDescent(wl).choose(s, slice_(0.25, cpu=2000)) == Choice(1, (0,))


def test_default_breaks_fragmentation_ties_toward_the_fuller_node() -> None:
    s = state([[1000], [500]])
    assert FragmentationGradientDescent(HALVES).choose(s, slice_(0.5)) == Choice(0, (0,))
    assert DefaultPolicy(HALVES).choose(s, slice_(0.5)) == Choice(1, (0,))


def test_fgd_cache_follows_commits() -> None:
    s = state([[1000], [1000]])
    policy = DefaultPolicy(HALVES)
    first = policy.choose(s, slice_(0.5))
    assert first is not None
    s.commit(first, slice_(0.5))
    # The half-used card is now the better home for the next half.
    assert policy.choose(s, slice_(0.5)) == first


@pytest.mark.parametrize("policy", [FragmentationGradientDescent, DefaultPolicy])
def test_remembered_node_states_decide_as_scoring_afresh(policy: type[FragmentationGradientDescent]) -> None:
    # Nodes that differ only in CPU or only in which card is used: a memo keyed on less than
    # the whole node state would give one of them another's score.
    demands = [slice_(0.5), slice_(0.25), Demand(cpu_milli=8000), Demand(gpus=1, cpu_milli=4000), slice_(0.75)]
    workload = Workload.from_demands(demands)
    cpu = [16000, 64000, 16000, 64000]
    remembered, fresh = state([[1000] * 2] * 4, cpu), state([[1000] * 2] * 4, cpu)
    mine, theirs = policy(workload), policy(workload, remember_states=False)
    rng = np.random.default_rng(7)
    for _ in range(40):
        demand = demands[int(rng.integers(len(demands)))]
        choice = mine.choose(remembered, demand)
        assert choice == theirs.choose(fresh, demand)
        if choice is not None:
            remembered.commit(choice, demand)
            fresh.commit(choice, demand)


def mixed_cluster() -> ClusterState:
    """Twelve nodes of two models, four sizes of card count and three of CPU: states that differ
    in CPU only, in model only, in how many cards."""
    cards = [8, 8, 4, 4, 2, 1, 8, 4, 2, 2, 1, 1]
    return ClusterState(
        [f"n{i}" for i in range(12)],
        [96000, 64000, 32000, 64000, 16000, 8000, 128000, 32000, 16000, 8000, 8000, 4000],
        [512 * GiB] * 6 + [256 * GiB] * 6,
        [[1000.0] * c for c in cards],
        [["G2" if i % 3 else "T4"] * c for i, c in enumerate(cards)],
    )


def arrival_types() -> list[Demand]:
    """Slices, whole and multi-card tasks, CPU-only tasks, model-bound tasks (the trace's kinds)."""
    t4 = frozenset({"T4"})
    return [
        *(slice_(share, cpu=cpu) for share in (0.1, 0.25, 0.5, 0.7) for cpu in (2000, 6000)),
        Demand(slice_fraction=0.5, cpu_milli=4000, models=t4),
        *(Demand(gpus=n, cpu_milli=cpu) for n in (1, 2, 4, 8) for cpu in (4000, 16000)),
        Demand(gpus=1, cpu_milli=8000, models=t4),
        Demand(cpu_milli=2000, memory_bytes=4 * GiB),
        Demand(cpu_milli=12000, memory_bytes=64 * GiB),
    ]


@pytest.mark.parametrize("policy", [FragmentationGradientDescent, DefaultPolicy])
def test_a_policy_told_the_arrivals_so_far_decides_as_one_made_afresh_for_each(
    policy: type[FragmentationGradientDescent],
) -> None:
    """What the replay does (one policy, ``know`` before each decision, node states and types
    remembered across) against what the extender does (a new policy for every pod, scoring
    every state afresh): the same choices, through arrivals that bring new types all along and
    a target smaller than the types seen (so types leave and come back)."""
    types = arrival_types()
    rng = np.random.default_rng(11)
    mine, theirs = mixed_cluster(), mixed_cluster()
    told = policy(known_workload({}, types[0]), max_types=6)
    arrived: Counter[Demand] = Counter()
    placed = 0
    for _ in range(160):
        demand = types[int(rng.integers(len(types)))]
        told.know(known_workload(arrived, demand))
        choice = told.choose(mine, demand)
        fresh = policy(known_workload(arrived, demand), max_types=6, remember_states=False)
        assert choice == fresh.choose(theirs, demand)
        arrived[demand] += 1
        if choice is not None:
            placed += 1
            mine.commit(choice, demand)
            theirs.commit(choice, demand)
    assert 40 < placed < 160  # the cluster filled up: later arrivals were refused


def test_remembered_values_stay_right_when_the_table_fills_and_starts_again() -> None:
    """A table of three states and two types, asked for more of both: it starts again (and widens
    for a target of three types) and still answers what scoring afresh answers."""

    def score(types: WorkloadArrays, *state: np.ndarray) -> np.ndarray:
        return np.asarray(type_fragment(types, *state))[None]

    small = TypeValues(score, 1, ["T4"], slots=3, max_types=2)
    fresh = TypeValues(score, 1, ["T4"], remember=False)
    shapes = [slice_(0.25), slice_(0.5), Demand(gpus=1), Demand(gpus=2)]
    rng = np.random.default_rng(5)
    for step in range(30):
        target = [shapes[i] for i in rng.choice(4, size=1 + step % 3, replace=False)]
        s = state(rng.choice([0, 250, 500, 1000], size=(4, 2)).tolist())
        asked = (s.free, s.cap, s.model, s.usable, s.cpu, s.mem)
        mine, theirs = small.columns(target), fresh.columns(target)  # the types first, then their values
        assert small.values(*asked)[0][:, mine].tolist() == fresh.values(*asked)[0][:, theirs].tolist()
    assert small.generation > 0 and small.max_types == 3


def test_the_known_workload_is_every_arrival_so_far_and_the_one_arriving() -> None:
    half, whole, cpu = slice_(0.5), Demand(gpus=1), Demand(cpu_milli=1000)
    arrived = Counter({half: 3, whole: 1})
    known = known_workload(arrived, whole)
    assert dict(zip(known.demands, known.weights, strict=True)) == {half: 0.6, whole: 0.4}
    assert known.demands == (half, whole)  # the most popular first
    first = known_workload(arrived, cpu)
    assert dict(zip(first.demands, first.weights, strict=True)) == {half: 0.6, whole: 0.2, cpu: 0.2}
    assert arrived == Counter({half: 3, whole: 1})  # what was passed in is left alone
    assert known_workload({}, cpu).demands == (cpu,)
    # Every type is kept: each policy keeps as many of the most popular as it scores.
    many = Counter({slice_(k / 100): 1 for k in range(1, 81)})
    assert len(known_workload(many, cpu).demands) == 81


def test_best_fit_and_spread_are_opposites() -> None:
    s = state([[1000, 400], [900]])
    assert BestFit().choose(s, slice_(0.3)) == Choice(0, (1,))
    assert Spread().choose(s, slice_(0.3)) == Choice(0, (0,))


def test_whole_cards_need_wholly_free_cards_on_one_node() -> None:
    s = state([[1000, 999], [1000, 1000]])
    for name in POLICIES:
        assert make_policy(name, HALVES).choose(s, Demand(gpus=2)) == Choice(1, (0, 1)), name
    assert BestFit().choose(s, Demand(gpus=3)) is None


def test_model_constraints_are_honoured() -> None:
    s = ClusterState(["a", "b"], [64000, 64000], [GiB, GiB], [[1000], [1000]], [["T4"], ["V100"]])
    want_v100 = Demand(slice_fraction=0.5, models=frozenset({"V100"}))
    for name in POLICIES:
        assert make_policy(name, HALVES).choose(s, want_v100) == Choice(1, (0,)), name
    assert BestFit().choose(s, Demand(slice_fraction=0.5, models=frozenset({"A100"}))) is None


def test_cpu_and_memory_are_honoured() -> None:
    s = state([[1000], [1000]], cpu=[1000, 8000])
    for name in POLICIES:
        assert make_policy(name, HALVES).choose(s, slice_(0.5, cpu=4000)) == Choice(1, (0,)), name


def test_unhealthy_gpus_and_nodes_take_nothing() -> None:
    s = ClusterState(
        ["a", "b"],
        [64000, 64000],
        [GiB, GiB],
        [[1000, 1000], [1000]],
        [["T4", "T4"], ["T4"]],
        gpu_healthy=[[False, True], [True]],
        node_ok=[True, False],
    )
    assert BestFit().choose(s, slice_(0.5)) == Choice(0, (1,))


def test_slices_in_bytes_on_mixed_cards() -> None:
    inv = build_local(simulated_gpus("1x16GiB:T4,1x80GiB:H100"), [(0, Allocation("a", "", 10 * GiB))])
    s = ClusterState.from_inventory(inv)
    demand = Demand.from_request(GpuRequest(memory_bytes=8 * GiB))
    assert BestFit().choose(s, demand) == Choice(0, (1,))  # 6 GiB free on the T4 is too little
    quarter = Demand.from_request(GpuRequest(fraction=0.25))
    assert BestFit().choose(s, quarter) == Choice(0, (0,))  # 4 GiB of the T4 fits its 6 free
    assert s.commit(Choice(0, (1,)), demand) == pytest.approx(0.1)


def test_cpu_only_demands_take_a_node_and_no_gpu() -> None:
    s = state([[1000], [0]], cpu=[2000, 8000])
    for name in POLICIES:
        choice = make_policy(name, HALVES).choose(s, Demand(cpu_milli=4000))
        assert choice == Choice(1, ()), name


def test_random_fit_is_reproducible_by_seed() -> None:
    s = state([[1000]] * 20)
    picks = [RandomFit(seed=7).choose(s, slice_(0.5)) for _ in range(2)]
    assert picks[0] == picks[1]


def test_dot_product_prefers_the_node_aligned_with_the_demand() -> None:
    s = state([[1000], [1000]], cpu=[1000, 64000])
    assert DotProduct().choose(s, slice_(0.5, cpu=800)) == Choice(1, (0,))


def test_unknown_policy_and_missing_workload() -> None:
    with pytest.raises(ValueError, match="unknown placement policy 'worst-fit'"):
        make_policy("worst-fit")
    with pytest.raises(ValueError, match="needs a target workload"):
        make_policy("fgd")


def test_workload_keeps_the_most_popular_types() -> None:
    demands = [slice_(0.5)] * 6 + [slice_(0.25)] * 3 + [Demand(gpus=1)]
    wl = Workload.from_demands(demands, coverage=0.9)
    assert wl.demands == (slice_(0.5), slice_(0.25))
    assert wl.weights == pytest.approx((6 / 9, 3 / 9))
    with pytest.raises(ValueError):
        Workload.from_demands([])


def test_workload_top_keeps_the_most_popular_types_and_scales_their_weights() -> None:
    wl = Workload((slice_(0.5), slice_(0.25), Demand(gpus=1)), (0.2, 0.5, 0.3))
    top = wl.top(2)
    assert top.demands == (slice_(0.25), Demand(gpus=1))
    assert top.weights == pytest.approx((0.5 / 0.8, 0.3 / 0.8))
    assert wl.top(3) is wl


def test_grouped_workload_keeps_every_gpu_shape_with_its_whole_weight() -> None:
    v100 = frozenset({"V100"})
    popular = [slice_(0.5, cpu=c) for c in (1000, 2000, 3000)]
    bound_small = Demand(cpu_milli=4000, gpus=4, models=v100)
    bound_large = Demand(cpu_milli=8000, gpus=4, models=v100)
    wl = Workload((*popular, bound_small, bound_large), (0.4, 0.3, 0.2, 0.06, 0.04))
    # The three most popular types are all half-card slices: the top three leave out the
    # four-card V100 tasks altogether.
    assert all(d.gpus == 0 for d in wl.top(3).demands)
    grouped = wl.grouped(3)
    # Each shape's most popular type, then the next most popular; the left-out types'
    # weight goes to their shape's most popular type.
    assert grouped.demands == (popular[0], popular[1], bound_small)
    assert grouped.weights == pytest.approx((0.4 + 0.2, 0.3, 0.06 + 0.04))


def test_grouped_workload_exceeds_max_types_only_for_more_shapes() -> None:
    shapes = [slice_(share / 10) for share in range(1, 6)]
    wl = Workload(tuple(shapes), (0.2,) * 5)
    assert wl.grouped(2).demands == tuple(shapes)


def test_bound_demand_per_free_card_splits_a_bound_type_over_its_models() -> None:
    two_of_ab = Demand(gpus=2, models=frozenset({"A", "B"}))
    any_model = slice_(0.5)
    arrays = WorkloadArrays.build(Workload((two_of_ab, any_model), (0.5, 0.5)), ["A", "B", "C"])
    # 0.5 x 2 cards split over A and B: 0.5 each; A has 2 free cards, B none (nothing to
    # weigh), C is asked for by no bound type. The unbound slice counts nowhere.
    pressure = bound_demand_per_free_card(arrays, np.array([2.0, 0.0, 3.0]))
    assert list(pressure) == pytest.approx([0.25, 0.0, 0.0])


def test_spare_bound_models_sends_an_unbound_card_to_the_model_no_bound_task_needs() -> None:
    s = ClusterState(["v100", "t4"], [64000] * 2, [256 * GiB] * 2, [[1000.0], [1000.0]], [["V100"], ["T4"]])
    workload = Workload((Demand(gpus=2, models=frozenset({"V100"})), Demand(gpus=1)), (0.5, 0.5))
    # Either card lowers fragmentation alike (the two-card type fits neither node): a tie,
    # which best-fit alone gives to the first node.
    assert DefaultPolicy(workload).choose(s, Demand(gpus=1)) == Choice(0, (0,))
    assert DefaultPolicy(workload, spare_bound_models=True).choose(s, Demand(gpus=1)) == Choice(1, (0,))


def test_tolerance_per_type_sees_a_rare_type_lose_its_last_two_free_cards() -> None:
    s = state([[0, 1000, 1000], [1000, 1000, 1000]])
    workload = Workload((slice_(0.5), Demand(gpus=2)), (0.998, 0.002))
    # A half card on node 0 leaves one free card: the two-card type no longer fits there,
    # 0.002 x 1.5 cards = 0.003 of fragmentation, under 1% of a card, so default calls it a
    # tie and packs node 0; 1% of the rarest type's weight (2e-5) does not.
    assert DefaultPolicy(workload).choose(s, slice_(0.5)) == Choice(0, (1,))
    assert DefaultPolicy(workload, tolerance_per_type=True).choose(s, slice_(0.5)) == Choice(1, (0,))


def test_lookahead_keeps_places_for_the_two_card_tasks_still_to_come() -> None:
    # Eight-card nodes with 4 and 5 wholly free cards; half the arrivals ask for two cards.
    s = state([[0, 0, 0, 0, 1000, 1000, 1000, 1000], [0, 0, 0, 1000, 1000, 1000, 1000, 1000]])
    two_cards = Workload((slice_(0.5), Demand(gpus=2)), (0.5, 0.5))
    # A half card breaks one free card on either node, and the two-card type still fits both:
    # the same fragmentation, a tie, which best-fit gives to the fuller node 0. That leaves it
    # 3 free cards, room for one two-card task instead of two; on node 1, 4 free cards still
    # take two. The cluster's 9 free cards take about 7 more arrivals, 3.6 of them two-card
    # tasks expected, against 3 places or 4: lookahead keeps the fourth.
    assert DefaultPolicy(two_cards, overflow="off").choose(s, slice_(0.5)) == Choice(0, (4,))
    assert DefaultPolicy(two_cards, overflow="off", lookahead=True).choose(s, slice_(0.5)) == Choice(1, (3,))
    # Change 3 ranks the same expected failed demand first, among every candidate: the same choice.
    assert DefaultPolicy(two_cards).choose(s, slice_(0.5)) == Choice(1, (3,))
    # With no multi-card arrivals to come, the half slices have 17 places either way: best-fit.
    halves_only = Workload((slice_(0.5),), (1.0,))
    assert DefaultPolicy(halves_only, overflow="off", lookahead=True).choose(s, slice_(0.5)) == Choice(0, (4,))
    assert DefaultPolicy(halves_only).choose(s, slice_(0.5)) == Choice(0, (4,))


def test_overflow_keeps_the_only_node_an_eight_card_type_fits() -> None:
    # Node 0 has the CPU an 8-card, 120-CPU type needs (its only place); node 1 the memory a
    # one-card, 300 GiB type needs (its only place). An 8-card, 64-CPU task fits both.
    s = ClusterState(
        ["cpu-rich", "memory-rich"],
        [128000, 96000],
        [256 * GiB, 512 * GiB],
        [[1000.0] * 8, [1000.0] * 8],
        [["T4"] * 8, ["T4"] * 8],
    )
    big_cpu = Demand(cpu_milli=120000, memory_bytes=100 * GiB, gpus=8)
    big_memory = Demand(cpu_milli=8000, memory_bytes=300 * GiB, gpus=1)
    either = Demand(cpu_milli=64000, memory_bytes=100 * GiB, gpus=8)
    workload = Workload((big_cpu, big_memory, either), (0.2, 0.3, 0.5))
    # FGD fills the node whose free cards more of the workload cannot use: node 0 (the
    # one-card type, weight 0.3, cannot use it; the 8-card type, 0.2, cannot use node 1).
    assert FragmentationGradientDescent(workload).choose(s, either) == Choice(0, tuple(range(8)))
    assert DefaultPolicy(workload, overflow="off").choose(s, either) == Choice(0, tuple(range(8)))
    # Expected failed demand of the arrivals to come: losing the 8-card type's only place costs
    # more (8 cards each) than losing the one-card type's (1 card each).
    assert DefaultPolicy(workload).choose(s, either) == Choice(1, tuple(range(8)))  # overflow="first"
    assert DefaultPolicy(workload, overflow="sum").choose(s, either) == Choice(1, tuple(range(8)))


def test_expected_overflow_is_the_poisson_arrivals_beyond_the_places() -> None:
    mean = np.array([2.0, 0.0])
    # E[max(0, N - c)] for N ~ Poisson(2): c = 0 gives the mean; c = 1 gives 2 - 1 + P(N = 0).
    got = expected_overflow(mean, np.array([[0.0, 0.0], [1.0, 3.0]]))
    assert got == pytest.approx(np.array([[2.0, 0.0], [1.0 + np.exp(-2.0), 0.0]]))


def test_type_capacity_counts_tasks_one_after_another() -> None:
    s = state([[500, 1000, 1000]], cpu=[3000])
    wl = Workload((slice_(0.5, cpu=1000), Demand(gpus=2), Demand(cpu_milli=2000)), (0.4, 0.4, 0.2))
    arrays = WorkloadArrays.build(wl, s.model_names)
    # Five half slices fit the GPUs but 3 CPUs take three; two whole cards take one two-card
    # task; the CPU-only type takes one (3 of 2 CPUs each).
    assert type_capacity(arrays, s.free, s.cap, s.model, s.usable, s.cpu, s.mem).tolist() == [[3.0, 1.0, 1.0]]


def filled(s: ClusterState, wl: Workload) -> list[float]:
    arrays = WorkloadArrays.build(wl, s.model_names)
    return list(
        fragmentation(arrays, s.free, s.cap, s.model, s.usable, s.cpu, s.mem, cpu_tasks_fragment=False, filled=True)
    )


def test_filled_fragment_counts_what_a_full_node_of_the_type_leaves_unused() -> None:
    # 600 free takes one half slice and leaves 100: FGD counts none of it, as one slice fits.
    assert frag(state([[1000, 300], [600, 0]]), HALVES) == pytest.approx([0.3, 0.0])
    assert filled(state([[1000, 300], [600, 0]]), HALVES) == pytest.approx([0.3, 0.1])
    # Seven free cards take one four-card task and strand three; eight strand none.
    four = Workload((Demand(gpus=4),), (1.0,))
    seven = [1000.0] * 7 + [0.0]
    assert frag(state([seven]), four) == pytest.approx([0.0])
    assert filled(state([seven, [1000.0] * 8]), four) == pytest.approx([3.0, 0.0])


def test_filled_fragment_counts_gpus_the_node_has_no_cpu_to_feed() -> None:
    # Eight free cards and 16 CPUs: two half slices of 8 CPUs, one card used, seven left.
    hungry = Workload((slice_(0.5, cpu=8000),), (1.0,))
    assert frag(state([[1000.0] * 8], cpu=[16000]), hungry) == pytest.approx([0.0])
    assert filled(state([[1000.0] * 8], cpu=[16000]), hungry) == pytest.approx([7.0])
    # A type that cannot fit at all counts all of it, as in FGD.
    assert filled(state([[1000.0] * 8], cpu=[4000]), hungry) == pytest.approx([8.0])


def test_filled_fragment_keeps_an_empty_node_for_the_four_card_tasks() -> None:
    # One card for a one-card task: on the empty node (7 left, three stranded for the
    # four-card type) or on the node with 5 free (4 left, one four-card task, none stranded).
    s = state([[1000.0] * 8, [0, 0, 0] + [1000.0] * 5])
    wl = Workload((Demand(gpus=4), Demand(gpus=1)), (0.5, 0.5))
    assert FragmentationGradientDescent(wl).choose(s, Demand(gpus=1)) == Choice(0, (0,))
    assert DefaultPolicy(wl, filled_fragment=True).choose(s, Demand(gpus=1)) == Choice(1, (3,))


@settings(max_examples=60, deadline=None)
@given(
    frees=st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=4), min_size=1, max_size=5),
    cpus=st.lists(st.integers(0, 8000), min_size=5, max_size=5),
    share=st.integers(1, 1000),
    whole=st.integers(0, 3),
    cpu=st.integers(0, 8000),
    policy=st.sampled_from(POLICIES),
)
def test_every_choice_fits_and_none_means_nothing_fits(
    frees: list[list[int]], cpus: list[int], share: int, whole: int, cpu: int, policy: str
) -> None:
    s = state(frees, cpu=cpus[: len(frees)])
    demand = Demand(cpu_milli=cpu, gpus=whole) if whole else slice_(share / 1000, cpu=cpu)
    choice = make_policy(policy, Workload((slice_(0.5), Demand(gpus=1)), (0.5, 0.5))).choose(s, demand)
    host = s.cpu >= cpu
    if whole:
        feasible = host & (((s.free >= s.cap) & (s.cap > 0)).sum(axis=1) >= whole)
    else:
        feasible = host & (s.free >= share).any(axis=1)
    if choice is None:
        assert not feasible.any()
        return
    assert feasible[choice.node]
    before = s.free.copy()
    s.commit(choice, demand)
    assert (s.free >= -1e-6).all() and s.cpu[choice.node] >= 0
    taken = before - s.free
    assert np.isclose(taken.sum(), whole * 1000 if whole else share)


# ---------------------------------------------------------------- explain


def two_t4s_and_an_h100() -> Inventory:
    gpus = simulated_gpus("2x16GiB:T4,1x80GiB:H100")
    return build_local(
        gpus,
        [
            (0, Allocation("a", "", 12 * GiB)),
            (1, Allocation("b", "", 8 * GiB)),
            (2, Allocation("c", "", 70 * GiB)),
        ],
    )


def test_explain_names_the_largest_free_slice_and_what_would_start() -> None:
    why = explain(Demand.from_request(GpuRequest(memory_bytes=12 * GiB)), two_t4s_and_an_h100())
    assert why.summary == "Nothing can hold 12 GiB of one GPU right now."
    assert why.largest_free_bytes == 10 * GiB
    assert why.largest_free_where == "localhost GPU 2 (H100)"
    assert why.reasons == ("3 GPUs are without enough free memory.",)
    assert (
        why.suggestion
        == "The largest free slice is 10 GiB on localhost GPU 2 (H100): ask for that or less to start now."
    )
    assert "ask for that or less" in str(why)


def test_explain_names_the_model_constraint() -> None:
    demand = Demand.from_request(GpuRequest(memory_bytes=12 * GiB), models={"T4"})
    why = explain(demand, two_t4s_and_an_h100())
    assert "1 GPU is of another model (this server needs T4)." in why.reasons
    assert why.largest_free_where == "localhost GPU 1 (T4)" and why.largest_free_bytes == 8 * GiB


def test_explain_whole_cards_counts_free_cards() -> None:
    inv = build_local(simulated_gpus("2x16GiB:T4"), [(0, Allocation("a", "", GiB))])
    why = explain(Demand(gpus=2), inv)
    assert why.free_cards == 1
    assert why.suggestion == "1 whole GPU is free on one machine: ask for gpus=1 to start now."
    assert "1 GPU is already partly in use." in why.reasons


def test_explain_cpu_and_memory_shortfalls() -> None:
    inv = Inventory([Node("small", 2000, 4 * GiB, simulated_gpus("1x16GiB:T4", "small"))])
    why = explain(Demand(cpu_milli=4000, slice_units=GiB), inv)
    assert why.reasons == ("1 GPU is on machines without 4 free CPUs.",)
    assert why.suggestion.startswith("No GPU memory is free")
    why = explain(Demand(memory_bytes=8 * GiB, slice_units=GiB), inv)
    assert why.reasons == ("1 GPU is on machines without 8 GiB free memory.",)


def test_explain_out_of_service() -> None:
    inv = Inventory([Node("down", 64000, 64 * GiB, simulated_gpus("2x16GiB:T4", "down"), healthy=False)])
    why = explain(Demand(slice_units=GiB), inv)
    assert why.reasons == ("2 GPUs are out of service.",)


def test_default_keeps_its_grouping_only_while_the_order_of_the_types_stays() -> None:
    """Told the arrivals so far one by one, the target is what grouping each workload afresh gives,
    as the weights change at every arrival and the order of the types now and then."""
    types = arrival_types()
    rng = np.random.default_rng(3)
    policy = DefaultPolicy(known_workload({}, types[0]), max_types=6)
    arrived: Counter[Demand] = Counter()
    orders = set()
    for _ in range(200):
        demand = types[int(rng.integers(len(types)))]
        workload = known_workload(arrived, demand)
        policy.know(workload)
        target = policy.target()
        assert (target.demands, target.weights) == (workload.grouped(6).demands, workload.grouped(6).weights)
        orders.add(workload.demands)
        arrived[demand] += 1
    assert len(orders) > 100  # the order changed often, not only the weights


def test_the_places_kept_per_type_are_the_sum_over_the_nodes_after_every_decision() -> None:
    """``default`` keeps each type's places in the whole cluster as nodes change (change 3 reads
    them at every decision): after each commit, what summing every node's places gives."""
    types = arrival_types()
    rng = np.random.default_rng(5)
    cluster = mixed_cluster()
    policy = DefaultPolicy(known_workload({}, types[0]), max_types=6)
    arrived: Counter[Demand] = Counter()
    for _ in range(120):
        demand = types[int(rng.integers(len(types)))]
        policy.know(known_workload(arrived, demand))
        choice = policy.choose(cluster, demand)
        arrived[demand] += 1
        if choice is not None:
            cluster.commit(choice, demand)
        now = policy._refresh(cluster)  # the values of the nodes as they are after the commit
        places = np.where(np.isfinite(now[1]), now[1], 0.0).sum(axis=0)
        assert policy._now_total[1, : places.size].tolist() == places.tolist()


def _values_scored_in_full(
    wl: WorkloadArrays,
    s: ClusterState,
    nodes: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    *,
    places: bool,
    cpu_frag: bool,
) -> np.ndarray:
    """(K, C, T): the fragment (and places) of the nodes' GPUs with this CPU and memory, from ``FitParts``."""
    parts = FitParts.of(wl, s.free[nodes], s.cap[nodes], s.model[nodes], s.usable[nodes], cpu, mem)
    return np.stack([parts.fragment(cpu_tasks_fragment=cpu_frag)] + ([parts.places()] if places else []))


@pytest.mark.parametrize("places", [False, True])
def test_values_after_a_task_of_no_gpu_are_those_scored_in_full(places: bool) -> None:
    """``host_only_after`` (the values of node states after placing a task that asks for no GPU,
    from their values before) gives, bit for bit, what scoring the states after in full gives,
    for every kind of type, with and without the places plane, CPU-only types fragmenting or not."""
    types = arrival_types()
    wl = WorkloadArrays.build(Workload(tuple(types), (1.0 / len(types),) * len(types)), ["G2", "T4"])
    rng = np.random.default_rng(13)
    changed = 0
    for _ in range(20):
        s = mixed_cluster()
        s.free[:] = np.where(s.cap > 0, rng.choice([0.0, 100.0, 250.0, 500.0, 700.0, 1000.0], size=s.free.shape), 0.0)
        s.healthy &= rng.random(s.healthy.shape) > 0.1
        task = Demand(cpu_milli=int(rng.choice([0, 2000, 6000, 14000])), memory_bytes=int(rng.choice([0, 60])) * GiB)
        nodes = np.flatnonzero(s.host_fits(task))
        cpu, mem = s.cpu[nodes] - task.cpu_milli, s.mem[nodes] - task.memory_bytes
        for cpu_frag in (False, True):
            now = _values_scored_in_full(wl, s, nodes, s.cpu[nodes], s.mem[nodes], places=places, cpu_frag=cpu_frag)
            derived = host_only_after(wl, now, s.free[nodes], s.cap[nodes], s.usable[nodes], cpu, mem)
            after = _values_scored_in_full(wl, s, nodes, cpu, mem, places=places, cpu_frag=cpu_frag)
            assert derived.tobytes() == after.tobytes()
            changed += derived.tobytes() != now.tobytes()
    assert changed > 10  # most tasks took CPU or memory some types needed: values did change


def test_distinct_gpus_keeps_the_first_of_equal_candidate_gpus_on_each_node() -> None:
    """``distinct_gpus`` against the pairwise comparison it replaced (every pair of a node's GPUs,
    the later half masked), on random nodes of equal and unequal, candidate and other GPUs."""
    rng = np.random.default_rng(17)
    for width in (1, 2, 3, 8):
        s = state(rng.choice([0.0, 250.0, 500.0, 1000.0], size=(40, width)).tolist())
        s.model[:] = rng.integers(0, 2, size=s.model.shape)
        cand = rng.random(s.free.shape) < 0.7
        gpu = s.free * 1.1 + s.cap * 1.3 + s.model * 1.7  # any weights tell these GPUs apart
        same = (gpu[:, :, None] == gpu[:, None, :]) & cand[:, None, :]
        earlier = np.tril(np.ones((width, width), dtype=bool), k=-1)
        assert distinct_gpus(s, cand).tolist() == (cand & ~(same & earlier).any(axis=2)).tolist()


def test_scoring_each_distinct_gpu_once_gives_the_numbers_of_scoring_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FitParts`` works out what a GPU takes of each shape once per distinct GPU (``DistinctGpus``)
    when the states are many: bit for bit what working it out for every GPU gives (fragments of
    every flavour and places), on random states with many equal GPUs, some unusable."""
    types = arrival_types()
    wl = WorkloadArrays.build(Workload(tuple(types), (1.0 / len(types),) * len(types)), ["G2", "T4"])
    rng = np.random.default_rng(19)
    for _ in range(10):
        s = mixed_cluster()
        rows = rng.integers(0, len(s.names), size=400)
        free = np.where(
            s.cap[rows] > 0, rng.choice([0.0, 125.0, 250.0, 333.0, 700.0, 1000.0], size=(400, s.cap.shape[1])), 0.0
        )
        usable = s.usable[rows] & (rng.random(free.shape) > 0.05)
        cpu = s.cpu[rows] * rng.choice([1.0, 0.5, 0.1], size=400)
        args = (wl, free, s.cap[rows], s.model[rows], usable, cpu, s.mem[rows])
        numbers = []
        for dedupe_from in (0, 10**12):  # every time, then never
            monkeypatch.setattr(DistinctGpus, "DEDUPE_FROM", dedupe_from)
            parts = FitParts.of(*args)
            assert (parts.gpus.inverse is None) == (dedupe_from > 0)
            flavours = [parts.fragment(cpu_tasks_fragment=c, filled=f) for c in (False, True) for f in (False, True)]
            numbers.append(b"".join(a.tobytes() for a in [*flavours, parts.places()]))
        assert numbers[0] == numbers[1]


def test_the_values_now_from_the_kept_rows_are_those_of_hashing_every_node_again() -> None:
    """When new types become known, the nodes that did not change are rescored from their kept rows
    of the remembered table (``_now_slot``), not hashed again: after every decision, each node's
    values now are bit for bit those the table gives for its state looked up afresh."""
    types = arrival_types()
    rng = np.random.default_rng(23)
    cluster = mixed_cluster()
    policy = DefaultPolicy(known_workload({}, types[0]), max_types=6)
    arrived: Counter[Demand] = Counter()
    from_kept = 0
    for _ in range(120):
        demand = types[int(rng.integers(len(types)))]
        policy.know(known_workload(arrived, demand))
        known_before = policy._values.known if policy._values is not None else 0
        choice = policy.choose(cluster, demand)
        arrived[demand] += 1
        if choice is not None:
            cluster.commit(choice, demand)
        now = policy._refresh(cluster)
        assert policy._values is not None
        from_kept += policy._values.known > known_before and bool((policy._now_slot >= 0).all())
        nodes = np.arange(len(cluster.names))
        afresh = policy._values.values(
            cluster.free, cluster.cap, cluster.model, cluster.usable, cluster.cpu, cluster.mem
        )
        assert now.tobytes() == np.ascontiguousarray(afresh[:, nodes]).tobytes()
    assert from_kept > 0  # new types arrived while every node's row was kept
