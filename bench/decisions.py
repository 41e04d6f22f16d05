"""A policy's decisions, one by one, to show that a change to its speed changes none of them.

    .venv/bin/python -m bench.decisions --data ../shared/data/alibaba-gpu-v2023 \\
        --policy default --mix 100 --mix 101 --save /tmp/before.json
    # ... change the code, then:
    .venv/bin/python -m bench.decisions --data ../shared/data/alibaba-gpu-v2023 \\
        --policy default --mix 100 --mix 101 --against /tmp/before.json

Each case (a visible pod list on the full node list, or a generated mix of bench.mixes) is
replayed as ``bench.placement.replay`` replays it, live unless ``--oracle``, and every decision
is kept: the node and the GPUs, or no place. Printed per case and seed: the decisions, how many
found no place, the unallocated GPUs and a digest of the whole sequence. ``--save`` writes the
sequences; ``--against`` compares with sequences saved before and names the first decision
that differs (exit status 1 if any does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.mixes import make_mix
from bench.placement import Knowledge, TraceNode, TraceTask, read_nodes, read_tasks, replay
from bench.report import make
from spawner.placement import Choice

Decision = list[object] | None  # [node, [gpus]], or None: no place


@dataclass(frozen=True)
class Decided:
    case: str
    seed: int
    unallocated_gpus: float
    decisions: list[Decision]

    @property
    def key(self) -> str:
        return f"{self.case} seed {self.seed}"

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.decisions).encode()).hexdigest()[:16]


def as_decision(choice: Choice | None) -> Decision:
    return None if choice is None else [choice.node, list(choice.gpus)]


def decide(
    case: str, nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], policy: str, seed: int, knowledge: Knowledge
) -> Decided:
    choices: list[Choice | None] = []
    result = replay(nodes, tasks, policy, seed, make, knowledge, choices=choices)
    return Decided(case, seed, result.unallocated_gpus, [as_decision(c) for c in choices])


def first_difference(before: Sequence[Decision], after: Sequence[Decision]) -> int | None:
    """The index of the first decision that differs (or the shorter length), None if all agree."""
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        if a != b:
            return i
    return None if len(before) == len(after) else min(len(before), len(after))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decisions", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with the openb node and pod lists")
    parser.add_argument("--policy", default="default", help="the policy or bench.report variant (default: default)")
    parser.add_argument("--lists", default="", help="visible pod lists, comma-separated (full node list)")
    parser.add_argument("--mix", type=int, action="append", default=[], help="a generated mix's index")
    parser.add_argument("--seeds", type=int, default=1, help="replays per case (default 1)")
    parser.add_argument("--oracle", action="store_true", help="hand the policy the whole list's popularity")
    parser.add_argument("--save", type=Path, help="write the sequences here (JSON)")
    parser.add_argument("--against", type=Path, help="compare with sequences saved by --save")
    args = parser.parse_args(argv)
    knowledge = Knowledge.ORACLE if args.oracle else Knowledge.LIVE
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    cases: list[tuple[str, Sequence[TraceNode], Sequence[TraceTask]]] = [
        (name, nodes, read_tasks(args.data / f"openb_pod_list_{name}.csv")) for name in args.lists.split(",") if name
    ]
    base = read_tasks(args.data / "openb_pod_list_default.csv")
    for index in args.mix:
        mix = make_mix(index, nodes, base)
        cases.append((mix.name, mix.nodes, mix.tasks))
    before = json.loads(args.against.read_text()) if args.against else {}
    saved, differ = {}, 0
    print(f"{args.policy}, {knowledge} knowledge")
    print("| case | seed | decisions | no place | unallocated GPUs | digest | against saved |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, case_nodes, tasks in cases:
        for seed in range(args.seeds):
            sequence = decide(name, case_nodes, tasks, args.policy, seed, knowledge)
            saved[sequence.key] = sequence.decisions
            verdict = "-"
            if sequence.key in before:
                at = first_difference(before[sequence.key], sequence.decisions)
                verdict = "same" if at is None else f"**differs from decision {at}**"
                differ += at is not None
            print(
                f"| {name} | {seed} | {len(sequence.decisions)} | {sequence.decisions.count(None)}"
                f" | {sequence.unallocated_gpus:.1f} | {sequence.digest()} | {verdict} |",
                flush=True,
            )
    if args.save:
        args.save.write_text(json.dumps(saved))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
