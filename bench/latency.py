"""Decision latency of fgd and default on the full cluster, in one run so that load cancels.

    flock /tmp/gpuslice-heavy.lock .venv/bin/python -m bench.latency \\
        --data ../shared/data/alibaba-gpu-v2023 --list default --seed 0 --busy 2 [--variant NAME]

Every policy replays the same arrivals on its own copy of the full node list (1,213 nodes,
6,212 GPUs); for each arrival the policies decide one after the other (the order rotates),
so a burst of load from other processes falls on all of them. Each knows what it would know
live (the arrivals so far, ``spawner.placement.knowledge``; ``--oracle``: the whole list), and
a decision's time includes working that out. ``--busy N`` keeps N other processes spinning on
the CPU for the whole run: the machine busy with other work, the same for every policy
(``--busy-nice 19``: work that yields to the decisions, as a scheduler given its CPU share would
see it). glibc's malloc is told to keep freed memory (``hub.malloc.keep_freed_memory``), as the
extender's server is; ``--glibc-default-malloc`` measures with glibc's defaults instead.
Printed: p50, p99 and max of a decision's wall time per policy, the ratios to ``fgd-fresh``
(FGD scoring every candidate state afresh, as before node states were remembered) and to
``fgd``, the p50 and p99 of its CPU time (what the decision costs, whatever else runs), and
how many decisions each remembering policy made as its afresh twin did, and the process's minor
page faults and peak RSS over the run (every policy's cluster copy in one process).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

from bench.placement import Knowledge, arrivals, cluster, oracle_workload, read_nodes, read_tasks
from bench.report import make
from bench.stats import percentile
from hub.malloc import keep_freed_memory
from spawner.placement import (
    DefaultPolicy,
    Demand,
    FragmentationGradientDescent,
    Informed,
    Policy,
    Workload,
    known_workload,
)

# Each remembering policy and the twin that scores every state afresh: they must decide alike.
TWINS = {"fgd": "fgd-fresh", "default": "default-fresh"}


def policies(workload: Workload) -> dict[str, Policy]:
    return {
        "fgd-fresh": FragmentationGradientDescent(workload, name="fgd-fresh", remember_states=False),
        "fgd": FragmentationGradientDescent(workload),
        "default-fresh": DefaultPolicy(workload, name="default-fresh", remember_states=False),
        "default": DefaultPolicy(workload),
    }


def _spin(stop: Event, niceness: int) -> None:
    os.nice(niceness)
    while not stop.is_set():
        sum(range(10_000))


@contextmanager
def busy(workers: int, niceness: int = 0) -> Iterator[None]:
    """``workers`` processes spinning on the CPU until the block ends (stopped and joined even on
    error), at ``niceness`` (0: the same priority as the decisions; 19: work that yields)."""
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop, niceness), daemon=True) for _ in range(workers)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(timeout=10)
            if spinner.is_alive():
                spinner.kill()
                spinner.join()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with the openb node and pod lists")
    parser.add_argument("--list", default="default", help="visible pod list (default: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oracle", action="store_true", help="hand every policy the whole list's popularity")
    parser.add_argument("--busy", type=int, default=0, help="other processes kept spinning meanwhile (default 0)")
    parser.add_argument(
        "--busy-nice", type=int, default=0, help="their niceness (default 0: as the decisions; 19: background work)"
    )
    parser.add_argument("--limit", type=int, help="decide only the first N arrivals")
    parser.add_argument("--variant", action="append", default=[], help="also time this bench.report variant")
    parser.add_argument(
        "--glibc-default-malloc",
        action="store_true",
        help="leave glibc's malloc thresholds as they are (default: keep freed memory, as the extender does)",
    )
    args = parser.parse_args(argv)
    kept = False if args.glibc_default_malloc else keep_freed_memory()
    knowledge = Knowledge.ORACLE if args.oracle else Knowledge.LIVE
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(args.data / f"openb_pod_list_{args.list}.csv")
    arrived = arrivals(tasks, float(sum(n.gpus for n in nodes)), args.seed)[: args.limit]
    workload = oracle_workload(tasks) if args.oracle else known_workload({}, arrived[0].demand())
    chosen = policies(workload)
    for name in args.variant:
        chosen[name] = make(name, workload, args.seed)
    names = list(chosen)
    states = {n: cluster(nodes) for n in names}
    timings: dict[str, list[float]] = {n: [] for n in names}
    cpu_times: dict[str, list[float]] = {n: [] for n in names}  # the thread's CPU time: what the decision costs
    same = Counter[str]()
    seen: Counter[Demand] = Counter()
    load = os.getloadavg()[0]
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with busy(args.busy, args.busy_nice):
        for i, task in enumerate(arrived):
            demand = task.demand()
            order = names[i % len(names) :] + names[: i % len(names)]
            picks = {}
            for name in order:
                policy = chosen[name]
                start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
                if knowledge is Knowledge.LIVE and isinstance(policy, Informed):
                    policy.know(known_workload(seen, demand))
                pick = policy.choose(states[name], demand)
                timings[name].append((time.perf_counter_ns() - start) / 1000)
                cpu_times[name].append((time.thread_time_ns() - cpu_start) / 1000)
                picks[name] = pick
                if pick is not None:
                    states[name].commit(pick, demand)
            seen[demand] += 1
            for mine, twin in TWINS.items():
                same[mine] += picks[mine] == picks[twin]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    gpus = sum(n.gpus for n in nodes)
    print(
        f"{args.list}, seed {args.seed}, {knowledge} knowledge: {len(arrived)} decisions on {gpus} GPUs;"
        f" {args.busy} other processes spinning (nice {args.busy_nice}); load average {load:.1f} at the start,"
        f" {os.getloadavg()[0]:.1f} at the end"
    )
    malloc = "keeping freed memory (mallopt)" if kept else "glibc's defaults"
    print(
        f"malloc: {malloc}; {usage.ru_minflt - faults_before} minor page faults during the decisions;"
        f" peak RSS {usage.ru_maxrss / 1024:.0f} MiB"
    )
    for mine, twin in TWINS.items():
        print(f"{mine} decided as {twin} on {same[mine]} of {len(arrived)}")
    print("| policy | p50 µs | p99 µs | max µs | p99 / fgd-fresh | p99 / fgd | CPU p50 µs | CPU p99 µs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    p99 = {n: percentile(timings[n], 99) for n in names}
    for n in names:
        print(
            f"| {n} | {percentile(timings[n], 50):.0f} | {p99[n]:.0f} | {max(timings[n]):.0f}"
            f" | {p99[n] / p99['fgd-fresh']:.2f} | {p99[n] / p99['fgd']:.2f}"
            f" | {percentile(cpu_times[n], 50):.0f} | {percentile(cpu_times[n], 99):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
