"""Decision latency of fgd and default on the full cluster, in one run so that load cancels.

    flock /tmp/gpuslice-heavy.lock nice -n 19 .venv/bin/python -m bench.latency \\
        --data ../shared/data/alibaba-gpu-v2023 --list default --seed 0 [--variant default-lookahead]

Every policy replays the same arrivals on its own copy of the full node list (1,213 nodes,
6,212 GPUs); for each arrival the policies decide one after the other (the order rotates),
so a burst of load from other processes falls on all of them. Printed: p50, p99 and max of
``choose()`` per policy and the ratios to ``fgd-fresh`` (FGD scoring every candidate state
afresh, as before node states were remembered) and to ``fgd``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.placement import arrivals, cluster, read_nodes, read_tasks
from bench.report import make
from bench.stats import percentile
from spawner.placement import DefaultPolicy, FragmentationGradientDescent, Policy, Workload


def policies(workload: Workload) -> dict[str, Policy]:
    return {
        "fgd-fresh": FragmentationGradientDescent(workload, name="fgd-fresh", remember_states=False),
        "fgd": FragmentationGradientDescent(workload),
        "default": DefaultPolicy(workload),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with the openb node and pod lists")
    parser.add_argument("--list", default="default", help="visible pod list (default: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", default=[], help="also time this bench.report variant")
    args = parser.parse_args(argv)
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(args.data / f"openb_pod_list_{args.list}.csv")
    workload = Workload.from_demands((t.demand() for t in tasks), max_types=None)
    chosen = policies(workload)
    for name in args.variant:
        chosen[name] = make(name, workload, args.seed)
    names = list(chosen)
    states = {n: cluster(nodes) for n in names}
    timings: dict[str, list[float]] = {n: [] for n in names}
    same = 0
    arrived = arrivals(tasks, float(sum(n.gpus for n in nodes)), args.seed)
    for i, task in enumerate(arrived):
        demand = task.demand()
        order = names[i % len(names) :] + names[: i % len(names)]
        picks = {}
        for name in order:
            start = time.perf_counter_ns()
            pick = chosen[name].choose(states[name], demand)
            timings[name].append((time.perf_counter_ns() - start) / 1000)
            picks[name] = pick
            if pick is not None:
                states[name].commit(pick, demand)
        same += picks["fgd"] == picks["fgd-fresh"]
    print(f"{args.list}, seed {args.seed}: {len(arrived)} decisions on {sum(n.gpus for n in nodes)} GPUs")
    print(f"fgd decided as fgd-fresh on {same} of {len(arrived)}")
    print("| policy | p50 µs | p99 µs | max µs | p99 / fgd-fresh | p99 / fgd |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    p99 = {n: percentile(timings[n], 99) for n in names}
    for n in names:
        print(
            f"| {n} | {percentile(timings[n], 50):.0f} | {p99[n]:.0f} | {max(timings[n]):.0f}"
            f" | {p99[n] / p99['fgd-fresh']:.2f} | {p99[n] / p99['fgd']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
