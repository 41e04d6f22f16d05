"""Where a policy loses GPUs to FGD on a mix: failed tasks by kind, per seed.

    flock /tmp/gpuslice-heavy.lock nice -n 19 .venv/bin/python -m bench.losses \\
        --data ../shared/data/alibaba-gpu-v2023 --mix 12 --mix 3 --seeds 3 \\
        --policy fgd --policy default [--node-cpu 128]

For each mix and policy: unallocated GPUs per seed and the GPU demand of the tasks that
failed, by kind (sharing, one card, several cards) and by whether they were bound to a
GPU model. This is the analysis behind "what the losses are" in docs/placement.md, made
in oracle mode: each policy is told the whole mix's popularity before the first arrival.
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
from spawner.placement import FragmentationGradientDescent, Workload, WorkloadArrays, fragmentation


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


def first_breaks(
    nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], policy: str, seed: int, cpu_cores: int
) -> Counter[str]:
    """The tasks that took the first cards of a wholly free node with ``cpu_cores`` cores, by shape.

    Where a multi-card type fits only on the nodes of one CPU size, this says who used those nodes up.
    """
    state = cluster(nodes)
    capacity = float(sum(n.gpus for n in nodes))
    kind = [i for i, n in enumerate(nodes) if n.cpu_milli == cpu_cores * 1000]
    chooser = make(policy, Workload.from_demands((t.demand() for t in tasks), max_types=None), seed)
    broke: Counter[str] = Counter()
    for task in arrivals(tasks, capacity, seed):
        demand = task.demand()
        choice = chooser.choose(state, demand)
        if choice is None:
            continue
        if choice.node in kind and state.full_gpus(None)[choice.node].all() and demand.uses_gpu:
            what = f"{demand.gpus} cards" if demand.gpus else f"{demand.slice_fraction or 0:.2f} of a card"
            broke[f"{what}, {demand.cpu_milli // 1000} cores{', bound' if demand.models else ''}"] += 1
        state.commit(choice, demand)
    return broke


def empty_node_fragmentation(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask]) -> dict[str, float]:
    """FGD's fragmentation of each kind of node (cards, cores, model) while wholly free, in cards:
    the free GPU the list's workload cannot use there. FGD fills the kind with the most first."""
    state = cluster(nodes)
    fgd = FragmentationGradientDescent(Workload.from_demands((t.demand() for t in tasks), max_types=None))
    arrays = WorkloadArrays.build(fgd.target(), state.model_names)
    frag = fragmentation(arrays, state.free, state.cap, state.model, state.usable, state.cpu, state.mem)
    kinds: dict[str, float] = {}
    for i, node in enumerate(nodes):
        kinds.setdefault(f"{node.gpus} x {node.model}, {node.cpu_milli // 1000} cores", float(frag[i]))
    return kinds


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
    parser.add_argument(
        "--node-cpu", type=int, help="also say which tasks first broke a free node of this many cores (seed 0)"
    )
    args = parser.parse_args(argv)
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    base = read_tasks(args.data / "openb_pod_list_default.csv")
    for index in args.mix:
        mix = make_mix(index, nodes, base)
        print(f"{mix.name}: {mix.spec.label()}, {sum(n.gpus for n in mix.nodes)} GPUs", flush=True)
        print(f"  target workload: {coverage(mix.tasks)}", flush=True)
        if args.node_cpu:
            free_frag = sorted(empty_node_fragmentation(mix.nodes, mix.tasks).items(), key=lambda kv: -kv[1])
            print(
                "  fgd's fragmentation of a free node: " + ", ".join(f"{k} {v:.3f}" for k, v in free_frag), flush=True
            )
        for policy in args.policy or ["fgd", "default"]:
            runs = [failures(mix.nodes, mix.tasks, policy, s) for s in range(args.seeds)]
            per_seed = " ".join(f"{u:.1f}" for u, _ in runs)
            total: Counter[str] = Counter()
            for _, f in runs:
                total.update(f)
            kinds = ", ".join(f"{k} {v / args.seeds:.1f}" for k, v in sorted(total.items()))
            mean = statistics.fmean(u for u, _ in runs)
            print(f"  {policy:22s} {mean:7.1f} [{per_seed}]  failed (GPUs/seed, cpu: tasks): {kinds}", flush=True)
            if args.node_cpu:
                broke = first_breaks(mix.nodes, mix.tasks, policy, 0, args.node_cpu)
                shown = ", ".join(f"{n} x {what}" for what, n in broke.most_common())
                print(f"    first to break a free {args.node_cpu}-core node (seed 0): {shown or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
