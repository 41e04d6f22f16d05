"""Placement: choose a node and GPU(s) for a demand, and explain a refusal. Pure code.

* ``state``: the cluster as arrays (``ClusterState``), ``Demand`` and ``Choice``.
* ``fragmentation``: FGD's fragmentation model against a target ``Workload``.
* ``knowledge``: what a policy knows when it decides (``known_workload``): the arrivals so far.
* ``policies``: the policies by name (``make_policy``, ``POLICIES``).
* ``explain``: why nothing fits now, in words, and what would start now.
"""

from spawner.placement.explain import Explanation, explain
from spawner.placement.fragmentation import (
    Workload,
    WorkloadArrays,
    bound_demand_per_free_card,
    expected_overflow,
    fragmentation,
    type_capacity,
    type_fragment,
)
from spawner.placement.knowledge import Informed, arrived_counts, known_workload
from spawner.placement.policies import (
    POLICIES,
    BestFit,
    DefaultPolicy,
    DotProduct,
    FragmentationGradientDescent,
    RandomFit,
    Spread,
    make_policy,
)
from spawner.placement.state import Choice, ClusterState, Demand, Policy, held_demands

__all__ = [
    "POLICIES",
    "BestFit",
    "Choice",
    "ClusterState",
    "DefaultPolicy",
    "Demand",
    "DotProduct",
    "Explanation",
    "FragmentationGradientDescent",
    "Informed",
    "Policy",
    "RandomFit",
    "Spread",
    "Workload",
    "WorkloadArrays",
    "arrived_counts",
    "bound_demand_per_free_card",
    "expected_overflow",
    "explain",
    "fragmentation",
    "held_demands",
    "known_workload",
    "make_policy",
    "type_capacity",
    "type_fragment",
]
