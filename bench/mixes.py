"""Workload mixes resampled from a trace, to test a policy on workloads it was not designed on.

A mix is a pod list drawn from the base list's tasks with other shares of the four kinds
(GPU-sharing, one whole card, several cards, no GPU), some GPU tasks constrained to GPU
models, and a cluster sub-sampled from the node list. Every draw is seeded, so a mix is
named by its index and rebuilt the same everywhere. Pure code.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from bench.placement import MILLI, TraceNode, TraceTask


class Kind(StrEnum):
    SHARE = "share"  # one GPU, less than a whole card
    ONE = "one"  # one whole card
    MULTI = "multi"  # several whole cards
    CPU = "cpu"  # no GPU


def kind_of(task: TraceTask) -> Kind:
    if task.num_gpu == 0:
        return Kind.CPU
    if task.num_gpu > 1:
        return Kind.MULTI
    return Kind.SHARE if task.gpu_milli < MILLI else Kind.ONE


@dataclass(frozen=True)
class MixSpec:
    """Shares of the task kinds (ONE takes the rest), of constrained GPU tasks, and of the cluster."""

    share: float
    multi: float
    cpu: float
    constrained: float
    cluster: float

    def __post_init__(self) -> None:
        if min(self.share, self.multi, self.cpu, self.constrained) < 0 or self.share + self.multi + self.cpu > 1 + 1e-9:
            raise ValueError(f"kind shares must be >= 0 and sum to at most 1: {self}")
        if not 0 < self.cluster <= 1:
            raise ValueError(f"the cluster share must be in (0, 1]: {self}")

    @property
    def one(self) -> float:
        return max(0.0, 1.0 - self.share - self.multi - self.cpu)

    def label(self) -> str:
        return (
            f"share {self.share:.0%} one {self.one:.0%} multi {self.multi:.0%} cpu {self.cpu:.0%}"
            f" model-bound {self.constrained:.0%} cluster {self.cluster:.3g}"
        )


@dataclass(frozen=True)
class Mix:
    index: int
    spec: MixSpec
    nodes: tuple[TraceNode, ...]
    tasks: tuple[TraceTask, ...]

    @property
    def name(self) -> str:
        return f"mix{self.index:02d}"


# The ranges span the published openb lists and beyond: sharing 37% (default) to 77%
# (gpushare80), several cards ~1% to 20% (multigpu20), CPU-only 13%; the trace family's
# model-constrained lists bind up to a third of GPU tasks. Cluster shares 1/8..1/2 keep a
# mix's replay short and test smaller clusters, where a wrong choice strands a larger share.
SHARE_RANGE = (0.1, 0.9)
MULTI_RANGE = (0.0, 0.2)
CPU_RANGE = (0.0, 0.3)
CONSTRAINED_RANGE = (0.0, 0.35)
CLUSTER_SHARES = (0.125, 0.25, 0.5)
MIX_TASKS = 4000  # the population a replay draws from (with replacement)


def spec_for(index: int) -> MixSpec:
    """The index-th mix's shares, uniform in the ranges above (seeded by the index)."""
    rng = random.Random(f"mix-spec-{index}")
    multi = rng.uniform(*MULTI_RANGE)
    cpu = rng.uniform(*CPU_RANGE)
    share = min(rng.uniform(*SHARE_RANGE), 1.0 - multi - cpu)
    return MixSpec(share, multi, cpu, rng.uniform(*CONSTRAINED_RANGE), CLUSTER_SHARES[index % len(CLUSTER_SHARES)])


def model_choices(nodes: Sequence[TraceNode]) -> list[tuple[frozenset[str], int]]:
    """Allowed-model sets a constrained task may carry, weighted by the GPUs that satisfy them:
    each model alone, and the V100 pair the trace itself uses (V100M16|V100M32)."""
    per_model = Counter[str]()
    for node in nodes:
        per_model[node.model] += node.gpus
    choices = [(frozenset({m}), n) for m, n in sorted(per_model.items()) if n]
    pair = frozenset({"V100M16", "V100M32"})
    if all(per_model[m] for m in pair):
        choices.append((pair, sum(per_model[m] for m in pair)))
    return choices


def subsample(nodes: Sequence[TraceNode], share: float, rng: random.Random) -> tuple[TraceNode, ...]:
    """A random ``share`` of the nodes, in their original order."""
    keep = max(1, round(share * len(nodes)))
    picked = sorted(rng.sample(range(len(nodes)), keep))
    return tuple(nodes[i] for i in picked)


def make_mix(index: int, nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], spec: MixSpec | None = None) -> Mix:
    """The index-th mix resampled from ``tasks`` (seeded by the index)."""
    spec = spec or spec_for(index)
    rng = random.Random(f"mix-{index}")
    gpu_nodes = [n for n in nodes if n.gpus]
    cluster = subsample(gpu_nodes, spec.cluster, rng)
    by_kind: dict[Kind, list[TraceTask]] = {k: [] for k in Kind}
    for task in tasks:
        by_kind[kind_of(task)].append(task)
    kinds = [k for k in Kind if by_kind[k]]
    weights = [
        {Kind.SHARE: spec.share, Kind.ONE: spec.one, Kind.MULTI: spec.multi, Kind.CPU: spec.cpu}[k] for k in kinds
    ]
    if not any(weights):
        raise ValueError(f"the base pod list has none of the kinds this mix asks for: {spec.label()}")
    # Constraints only on the sub-sampled cluster's models, so every constrained task can fit somewhere.
    sets, set_weights = zip(*model_choices(cluster), strict=True)
    drawn = []
    for i in range(MIX_TASKS):
        kind = rng.choices(kinds, weights)[0]
        task = by_kind[kind][rng.randrange(len(by_kind[kind]))]
        models = task.gpu_spec
        if kind is not Kind.CPU and rng.random() < spec.constrained:
            models = rng.choices(sets, set_weights)[0]
        drawn.append(replace(task, name=f"{task.name}-m{index}-{i}", gpu_spec=models))
    return Mix(index, spec, cluster, tuple(drawn))
