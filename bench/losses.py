"""Where a policy loses GPUs to FGD on a mix: failed tasks by kind, per seed.

    flock /tmp/gpuslice-heavy.lock nice -n 19 .venv/bin/python -m bench.losses \\
        --data ../shared/data/alibaba-gpu-v2023 --mix 12 --mix 3 --seeds 3 \\
        --policy fgd --policy default

For each mix and policy: unallocated GPUs per seed and the GPU demand of the tasks that
failed, by kind (sharing, one card, several cards) and by whether they were bound to a
GPU model. This is the analysis behind "what the losses are" in docs/placement.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.mixes import Kind, kind_of, make_mix
from bench.placement import TraceNode, TraceTask, arrivals, cluster, read_nodes, read_tasks
from bench.report import make
from spawner.placement import Workload


def failures(
    nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], policy: str, seed: int
) -> tuple[float, dict[str, float]]:
    """Unallocated GPUs and the failed GPU demand by kind (and model-bound or not)."""
    state = cluster(nodes)
    capacity = float(sum(n.gpus for n in nodes))
    chooser = make(policy, Workload.from_demands((t.demand() for t in tasks), max_types=None), seed)
    allocated, failed = 0.0, defaultdict[str, float](float)  # GPUs (CPU-only: tasks)
    for task in arrivals(tasks, capacity, seed):
        demand = task.demand()
        choice = chooser.choose(state, demand)
        if choice is None:
            kind = kind_of(task)
            bound = "bound" if demand.models else "any"
            failed[f"{kind}/{bound}" if kind is not Kind.CPU else str(kind)] += task.gpu_demand or 1.0
            continue
        allocated += state.commit(choice, demand)
    return capacity - allocated, failed


def coverage(tasks: Sequence[TraceTask]) -> str:
    """How much of the list the target workload (its most popular types) covers."""
    demands = [t.demand() for t in tasks]
    counts = Counter(demands)
    kept = Workload.from_demands(demands).demands
    multi_bound = [d for d in demands if d.gpus > 1 and d.models]
    covered = sum(counts[d] for d in kept)
    kept_multi_bound = sum(counts[d] for d in kept if d.gpus > 1 and d.models)
    return (
        f"{len(counts)} task types, {len(kept)} kept, covering {covered / len(demands):.0%} of tasks;"
        f" model-bound multi-card tasks {len(multi_bound)}, {kept_multi_bound} of them of a kept type"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.losses", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--mix", type=int, action="append", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--policy", action="append")
    args = parser.parse_args(argv)
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    base = read_tasks(args.data / "openb_pod_list_default.csv")
    for index in args.mix:
        mix = make_mix(index, nodes, base)
        print(f"{mix.name}: {mix.spec.label()}, {sum(n.gpus for n in mix.nodes)} GPUs", flush=True)
        print(f"  target workload: {coverage(mix.tasks)}", flush=True)
        for policy in args.policy or ["fgd", "default"]:
            runs = [failures(mix.nodes, mix.tasks, policy, s) for s in range(args.seeds)]
            per_seed = " ".join(f"{u:.1f}" for u, _ in runs)
            total: Counter[str] = Counter()
            for _, f in runs:
                total.update(f)
            kinds = ", ".join(f"{k} {v / args.seeds:.1f}" for k, v in sorted(total.items()))
            mean = statistics.fmean(u for u, _ in runs)
            print(f"  {policy:22s} {mean:7.1f} [{per_seed}]  failed (GPUs/seed, cpu: tasks): {kinds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
