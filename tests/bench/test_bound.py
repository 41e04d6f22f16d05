"""The limit of placement on tiny clusters whose best packing is known by hand."""

import pytest

from bench.bound import bounds, dff, hardest_first, hindsight, pack, relaxation
from bench.placement import TraceNode, TraceTask
from spawner.placement import BestFit

GPU_MIB = 64 * 1024


def node(name: str, cards: int, cores: int = 64, model: str = "T4") -> TraceNode:
    return TraceNode(name, cores * 1000, GPU_MIB, cards, model)


def task(milli: int, cards: int = 1, cores: int = 1, models: frozenset[str] | None = None) -> TraceTask:
    return TraceTask(f"t{milli}-{cards}-{cores}", cores * 1000, 1024, cards, milli, models)


def test_slices_of_more_than_half_a_card_take_a_card_each() -> None:
    # Three cards; two slices of 0.6 and two of 0.7: no two share a card, so the best takes the
    # two 0.7 and one 0.6 (2.0 cards). Summing shares alone would admit all four (2.6 of 3).
    nodes = [node("n", 3)]
    arrived = [task(600), task(600), task(700), task(700)]
    assert relaxation(nodes, arrived).admitted_gpus == pytest.approx(2.0)
    assert hindsight(nodes, arrived).admitted_gpus == pytest.approx(2.0)


def test_the_dual_feasible_functions_bound_each_card() -> None:
    assert dff(0.6, 1) == 1.0 and dff(0.4, 1) == 0.0 and dff(0.5, 1) == 0.5
    assert dff(0.4, 2) == 0.5 and dff(0.25, 3) == 0.25 and dff(0.1, 2) == 0.0
    # Whatever fills one card, the u of its slices sum to at most 1.
    for shares in ([0.6, 0.4], [0.5, 0.5], [0.34, 0.33, 0.33], [0.25] * 4, [0.7, 0.2, 0.1]):
        assert all(sum(dff(s, k) for s in shares) <= 1 + 1e-9 for k in range(1, 11))


def test_tasks_bound_to_a_model_go_only_to_its_cards() -> None:
    # A T4 and a V100 card: two whole-card tasks bound to T4 (one fits) and half a card for anyone.
    nodes = [node("a", 1, model="T4"), node("b", 1, model="V100")]
    arrived = [task(1000, models=frozenset({"T4"})), task(1000, models=frozenset({"T4"})), task(500)]
    limit = bounds(nodes, arrived)
    assert limit.relaxation.admitted_gpus == pytest.approx(1.5)
    assert limit.hindsight.admitted_gpus == pytest.approx(1.5)
    assert limit.lowest_unallocated == pytest.approx(0.5) == limit.hindsight_unallocated


def test_cpu_bounds_what_a_node_takes() -> None:
    # Two cards but eight cores: three half-card slices of six cores each, only one fits.
    nodes = [node("n", 2, cores=8)]
    assert relaxation(nodes, [task(500, cores=6)] * 3).admitted_gpus == pytest.approx(0.5)
    # Multi-card tasks: a node takes as many as its cards allow.
    assert relaxation([node("n", 8)], [task(1000, cards=3)] * 3).admitted_gpus == pytest.approx(6.0)


def test_knowing_the_whole_sequence_packs_what_came_in_the_wrong_order() -> None:
    # One card; two slices of 0.3 come before a whole-card task. Taking them as they come admits
    # 0.6; the whole card first admits 1.0, the most possible.
    nodes = [node("n", 1)]
    arrived = [task(300), task(300), task(1000)]
    assert hardest_first(arrived)[0] == task(1000)
    assert pack(nodes, arrived, BestFit()) == pytest.approx(0.6)
    limit = bounds(nodes, arrived)
    assert limit.hindsight.admitted_gpus == pytest.approx(1.0) == limit.relaxation.admitted_gpus


def test_cpu_only_tasks_admit_nothing_and_are_left_out() -> None:
    nodes = [node("n", 1, cores=4)]
    arrived = [task(0, cards=0, cores=4), task(500, cores=2)]
    limit = bounds(nodes, arrived)
    assert limit.relaxation.admitted_gpus == pytest.approx(0.5) == limit.hindsight.admitted_gpus
