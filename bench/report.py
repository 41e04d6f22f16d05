"""The placement report of docs/placement.md: visible pod lists, generated mixes, leave-one-out.

    nice -n 19 .venv/bin/python -m bench.report --data ../shared/data/alibaba-gpu-v2023 \\
        --mixes 20 --seeds 3 --bound --json /tmp/report.json

For every visible pod list (on the full node list) and every generated mix (bench.mixes):
unallocated GPUs and GPU allocation ratio per policy (mean and spread over seeds), each
candidate's wins/ties/losses against FGD, its change against best-fit, and decision latency
p50/p99 on the full cluster. Leave-one-out: for each visible list, the candidate that did
best against FGD on the *other* visible lists is chosen and judged on the held-out one.

Each policy knows what it would know live (the arrivals so far); ``--oracle`` hands every
policy the whole list's popularity instead. ``--bound`` adds the limit of each replay
(bench.bound): the relaxation no placement beats, the best packing found in hindsight, and
each policy's unallocated GPUs against both.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy import stats

from bench.bound import Bounds, bounds
from bench.mixes import make_mix
from bench.placement import Knowledge, ReplayResult, TraceNode, TraceTask, arrivals, read_nodes, read_tasks, replay
from bench.stats import percentile
from spawner.placement import POLICIES, DefaultPolicy, Policy, Workload, make_policy

VISIBLE = ("default", "gpushare40", "gpushare60", "gpushare80", "multigpu20")
BASELINE = "fgd"
# Two means closer than half a card are a tie: below the smallest whole-card task, and
# within the spread that three seeds show on one list.
TIE_GPUS = 0.5
CONFIDENCE = 0.95  # the paired interval: seeds share arrival orders, so their differences are compared


def _needs(workload: Workload | None) -> Workload:
    if workload is None:
        raise ValueError("this policy needs the target workload")
    return workload


# Policies the report can run that are not in POLICIES: earlier forms of `default` and each of
# its changes alone, so that leave-one-out can choose among them on the lists it does not judge.
# All but the last two keep the 64 most popular types (change 4 off), as they were measured.
def _earlier(workload: Workload | None, name: str, **changes: Any) -> Policy:
    """A variant of `default` as docs/placement.md measured it: the 64 most popular types (no
    change 4), with ``changes``."""
    return DefaultPolicy(_needs(workload), name=name, **{"keep_every_shape": False, **changes})


VARIANTS: dict[str, Callable[[Workload | None, int], Policy]] = {
    # `default` before change 3: changes 1 and 2. The variants below it are that policy with one
    # change, as docs/placement.md measured them.
    "default-no-overflow": lambda w, _: _earlier(w, "default-no-overflow", overflow="off"),
    # Change 1 alone: CPU-only types fragment only where they do not fit; exact ties as FGD.
    "default-exact-ties": lambda w, _: _earlier(w, "default-exact-ties", tie_tolerance=1e-9, overflow="off"),
    # Change 2 alone: the paper's fragmentation; near-ties (1% of a card) to best-fit.
    "default-paper-frag": lambda w, _: _earlier(w, "default-paper-frag", cpu_tasks_fragment=True, overflow="off"),
    # Every task type in the target workload, not only the 64 most popular.
    "default-all-types": lambda w, _: _earlier(w, "default-all-types", max_types=1_000_000, overflow="off"),
    # Every GPU shape (cards or slice, allowed models) kept with its whole weight.
    "default-grouped": lambda w, _: _earlier(w, "default-grouped", keep_every_shape=True, overflow="off"),
    # Near-ties to the GPU model least needed by model-bound types per free card.
    "default-spare-models": lambda w, _: _earlier(w, "default-spare-models", spare_bound_models=True, overflow="off"),
    # Near-ties within 1% of a card of the rarest type's weight, not of the whole sum.
    "default-rare-ties": lambda w, _: _earlier(w, "default-rare-ties", tolerance_per_type=True, overflow="off"),
    # Near-ties to the candidate after which the arrivals still to come leave the least GPU demand unplaced.
    "default-lookahead": lambda w, _: _earlier(w, "default-lookahead", lookahead=True, overflow="off"),
    # A type's fragment: the free GPU its tasks leave unused once the node is filled with them.
    "default-filled": lambda w, _: _earlier(w, "default-filled", filled_fragment=True, overflow="off"),
    # The same, with the GPU alone bounding how many tasks the node takes (no CPU or memory).
    "default-filled-gpu": lambda w, _: _earlier(
        w, "default-filled-gpu", filled_fragment=True, filled_host=False, overflow="off"
    ),
    # Change 3 as designed, and its other form: the expected failed demand added to the
    # fragmentation growth rather than ranked before it.
    "default-overflow-first": lambda w, _: _earlier(w, "default-overflow-first", overflow="first"),
    "default-overflow-sum": lambda w, _: _earlier(w, "default-overflow-sum", overflow="sum"),
    # `default` before change 4 (changes 1-3: the 64 most popular types), the same as the above.
    "default-top-types": lambda w, _: _earlier(w, "default-top-types"),
    # Change 4 as designed (now `default`), under the name it was designed and judged with.
    "default-every-shape": lambda w, _: DefaultPolicy(_needs(w), name="default-every-shape"),
}


def make(name: str, workload: Workload | None, seed: int) -> Policy:
    if name in VARIANTS:
        return VARIANTS[name](workload, seed)
    return make_policy(name, workload, seed)


@dataclass(frozen=True)
class Case:
    name: str
    label: str
    capacity: float
    results: dict[str, list[ReplayResult]]
    limits: list[Bounds] = field(default_factory=list)  # per seed, with --bound

    def lowest(self) -> float:
        """Mean over seeds of the unallocated GPUs no placement goes below (the relaxation)."""
        return statistics.fmean(b.lowest_unallocated for b in self.limits)

    def hindsight(self) -> float:
        """Mean over seeds of the unallocated GPUs of the best packing found in hindsight."""
        return statistics.fmean(b.hindsight_unallocated for b in self.limits)

    def above_hindsight(self, policy: str) -> float:
        """How many more GPUs ``policy`` leaves unallocated than the hindsight packing, relatively."""
        best = self.hindsight()
        return (self.unallocated(policy) - best) / best if best else math.inf

    def gap_ratio(self, policy: str, against: str = BASELINE) -> float:
        """``policy``'s gap to the hindsight packing over ``against``'s (GPUs over GPUs)."""
        gap = self.unallocated(against) - self.hindsight()
        return (self.unallocated(policy) - self.hindsight()) / gap if gap > 0 else math.inf

    def unallocated(self, policy: str) -> float:
        return statistics.fmean(r.unallocated_gpus for r in self.results[policy])

    def change(self, policy: str, against: str) -> float:
        """Relative change in mean unallocated GPUs (negative: fewer than ``against``)."""
        base = self.unallocated(against)
        return (self.unallocated(policy) - base) / base if base else 0.0

    def outcome(self, policy: str, against: str = BASELINE) -> str:
        diff = self.unallocated(policy) - self.unallocated(against)
        return "tie" if abs(diff) < TIE_GPUS else ("win" if diff < 0 else "loss")

    def paired(self, policy: str, against: str = BASELINE) -> Paired:
        """Seed by seed (the same arrival order for both): ``policy``'s unallocated GPUs minus ``against``'s."""
        diffs = [
            a.unallocated_gpus - b.unallocated_gpus
            for a, b in zip(self.results[policy], self.results[against], strict=True)
        ]
        return Paired.of(diffs)


@dataclass(frozen=True)
class Paired:
    """The mean per-seed difference and its 95% confidence interval (Student's t over the seeds)."""

    mean: float
    low: float
    high: float
    seeds: int

    @classmethod
    def of(cls, diffs: Sequence[float]) -> Paired:
        mean = statistics.fmean(diffs)
        if len(diffs) < 2:
            return cls(mean, math.nan, math.nan, len(diffs))
        if statistics.stdev(diffs) == 0:  # every seed gave the same difference
            return cls(mean, mean, mean, len(diffs))
        low, high = stats.t.interval(CONFIDENCE, len(diffs) - 1, loc=mean, scale=stats.sem(diffs))
        return cls(mean, float(low), float(high), len(diffs))

    @property
    def verdict(self) -> str:
        """'worse' or 'better' only where the interval leaves out no difference at all; else 'not shown'."""
        if self.low > 0:
            return "worse"
        if self.high < 0:
            return "better"
        return "not shown"

    def text(self) -> str:
        return f"{self.mean:+.1f} [{self.low:+.1f}, {self.high:+.1f}] {self.verdict}"


def run_case(
    name: str,
    label: str,
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    policies: Sequence[str],
    seeds: int,
    knowledge: Knowledge = Knowledge.LIVE,
    bound: bool = False,
) -> Case:
    start = time.monotonic()
    results = {p: [replay(nodes, tasks, p, s, make, knowledge) for s in range(seeds)] for p in policies}
    capacity = float(sum(n.gpus for n in nodes))
    limits = [bounds(nodes, arrivals(tasks, capacity, s)) for s in range(seeds)] if bound else []
    print(f"  {name}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return Case(name, label, capacity, results, limits)


def spread(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def policy_figures(case: Case, policy: str) -> dict[str, float]:
    runs = case.results[policy]
    unallocated = [r.unallocated_gpus for r in runs]
    ratio = [r.gpu_allocation_ratio for r in runs]
    return {
        "unallocated_gpus": statistics.fmean(unallocated),
        "unallocated_gpus_sd": spread(unallocated),
        "gpu_allocation_ratio": statistics.fmean(ratio),
        "gpu_allocation_ratio_sd": spread(ratio),
    }


def latency(cases: Sequence[Case], policy: str) -> tuple[float, float]:
    """p50 and p99 (µs) over every decision of every seed of ``cases``."""
    decisions = [d for c in cases for r in c.results[policy] for d in r.decision_us]
    return percentile(decisions, 50), percentile(decisions, 99)


def leave_one_out(cases: Sequence[Case], candidates: Sequence[str]) -> list[dict[str, object]]:
    """For each case: the candidate best against FGD on the others, judged on it."""
    rows: list[dict[str, object]] = []
    for held in cases:
        others = [c for c in cases if c is not held]
        chosen = min(candidates, key=lambda p: statistics.fmean(c.change(p, BASELINE) for c in others))
        rows.append({"held_out": held.name, "chosen": chosen, "vs_fgd": held.change(chosen, BASELINE)})
    return rows


def tally(cases: Sequence[Case], policy: str) -> dict[str, float]:
    outcomes = [c.outcome(policy) for c in cases]
    changes = [c.change(policy, BASELINE) for c in cases]
    verdicts = [c.paired(policy).verdict for c in cases]
    return {
        "shown_worse": verdicts.count("worse"),
        "shown_better": verdicts.count("better"),
        "wins": outcomes.count("win"),
        "ties": outcomes.count("tie"),
        "losses": outcomes.count("loss"),
        "no_worse_share": (outcomes.count("win") + outcomes.count("tie")) / len(cases),
        "mean_vs_fgd": statistics.fmean(changes),
        "worst_vs_fgd": max(changes),
    }


def _cell(case: Case, policy: str) -> str:
    f = policy_figures(case, policy)
    return f"{f['unallocated_gpus']:.1f} ± {f['unallocated_gpus_sd']:.1f} ({f['gpu_allocation_ratio']:.4f})"


def render(visible: Sequence[Case], mixes: Sequence[Case], policies: Sequence[str], ours: Sequence[str]) -> str:
    out = ["## Visible pod lists, full cluster", ""]
    out.append(
        "| pod list | policy | GPU allocation ratio | unallocated GPUs | vs fgd | vs best-fit | p50 µs | p99 µs |"
    )
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in visible:
        for p in policies:
            f = policy_figures(case, p)
            p50, p99 = latency([case], p)
            vs_fgd = f"{case.change(p, BASELINE):+.1%}" if BASELINE in policies else ""
            vs_bf = f"{case.change(p, 'best-fit'):+.1%}" if "best-fit" in policies else ""
            out.append(
                f"| {case.name} | {p} | {f['gpu_allocation_ratio']:.4f} ± {f['gpu_allocation_ratio_sd']:.4f}"
                f" | {f['unallocated_gpus']:.1f} ± {f['unallocated_gpus_sd']:.1f} | {vs_fgd} | {vs_bf}"
                f" | {p50:.0f} | {p99:.0f} |"
            )
    if mixes:
        out += ["", "## Generated mixes: unallocated GPUs ± sd over seeds (allocation ratio)", ""]
        out.append(
            "| mix | GPUs | workload | "
            + " | ".join(policies)
            + " | "
            + " | ".join(f"{p} vs fgd | {p} - fgd per seed, GPUs [95% CI]" for p in ours)
            + " |"
        )
        out.append("| --- | ---: | --- |" + " ---: |" * (len(policies) + 2 * len(ours)))
        for case in mixes:
            cells = " | ".join(_cell(case, p) for p in policies)
            vs = " | ".join(
                f"{case.change(p, BASELINE):+.1%} {case.outcome(p)} | {case.paired(p).text()}" for p in ours
            )
            out.append(f"| {case.name} | {case.capacity:.0f} | {case.label} | {cells} | {vs} |")
    out += ["", "## Against FGD", ""]
    out.append("| policy | cases | wins | ties | losses | mean vs fgd | worst vs fgd | shown worse | shown better |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in ours:
        for what, cases in (("visible lists", visible), ("mixes", mixes)):
            if cases:
                t = tally(cases, p)
                out.append(
                    f"| {p} | {what} | {t['wins']:.0f} | {t['ties']:.0f} | {t['losses']:.0f}"
                    f" | {t['mean_vs_fgd']:+.2%} | {t['worst_vs_fgd']:+.2%}"
                    f" | {t['shown_worse']:.0f} | {t['shown_better']:.0f} |"
                )
    if any(c.limits for c in [*visible, *mixes]):
        out += render_limits(visible, mixes, policies, ours)
    if len(visible) > 1 and ours:
        out += ["", "## Leave-one-out over the visible lists", "", "| held out | chosen on the others | vs fgd |"]
        out.append("| --- | --- | ---: |")
        for row in leave_one_out(visible, ours):
            out.append(f"| {row['held_out']} | {row['chosen']} | {row['vs_fgd']:+.2%} |")
    if visible:
        out += ["", "## Decision latency on the full cluster (every decision, every visible list and seed)", ""]
        out += ["| policy | p50 µs | p99 µs |", "| --- | ---: | ---: |"]
        for p in policies:
            p50, p99 = latency(visible, p)
            out.append(f"| {p} | {p50:.0f} | {p99:.0f} |")
    return "\n".join(out) + "\n"


def render_limits(
    visible: Sequence[Case], mixes: Sequence[Case], policies: Sequence[str], ours: Sequence[str]
) -> list[str]:
    """Each case's limit (means over seeds) and each policy against it; then per policy, over the cases."""
    out = ["", "## Against the limit: unallocated GPUs (means over seeds)", ""]
    out.append(
        "| case | GPUs | relaxation (none lower) | hindsight (found) | "
        + " | ".join(f"{p} | {p} vs hindsight" for p in policies)
        + " | "
        + " | ".join(f"{p} gap / fgd gap" for p in ours)
        + " | hindsight packing (seed 0) |"
    )
    out.append("| --- | ---: | ---: | ---: |" + " ---: |" * (2 * len(policies) + len(ours)) + " --- |")
    for case in [*visible, *mixes]:
        if not case.limits:
            continue
        cells = " | ".join(f"{case.unallocated(p):.1f} | {case.above_hindsight(p):+.1%}" for p in policies)
        ratios = " | ".join(f"{case.gap_ratio(p):.2f}" for p in ours)
        out.append(
            f"| {case.name} | {case.capacity:.0f} | {case.lowest():.1f} | {case.hindsight():.1f} | {cells}"
            f" | {ratios} | {case.limits[0].hindsight.packer} |"
        )
    out += [
        "",
        "| policy | cases | mean vs hindsight | mean vs relaxation | gap to hindsight, GPUs (sum) | gap / fgd's (sums)"
        " | cases with gap at most half fgd's |",
    ]
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for p in policies:
        for what, cases in (("visible lists", visible), ("mixes", mixes)):
            cases = [c for c in cases if c.limits]
            if not cases:
                continue
            above = statistics.fmean(c.above_hindsight(p) for c in cases)
            over_lp = statistics.fmean((c.unallocated(p) - c.lowest()) / c.lowest() for c in cases)
            gap = sum(c.unallocated(p) - c.hindsight() for c in cases)
            fgd_gap = sum(c.unallocated(BASELINE) - c.hindsight() for c in cases) if BASELINE in policies else 0.0
            ratio = f"{gap / fgd_gap:.2f}" if fgd_gap > 0 else ""
            half = f"{sum(c.gap_ratio(p) <= 0.5 for c in cases)} of {len(cases)}" if p in ours else ""
            out.append(f"| {p} | {what} | {above:+.1%} | {over_lp:+.1%} | {gap:.1f} | {ratio} | {half} |")
    return out


def as_json(visible: Sequence[Case], mixes: Sequence[Case], policies: Sequence[str]) -> dict[str, object]:
    def case_json(c: Case) -> dict[str, object]:
        figures: dict[str, object] = {
            "label": c.label,
            "capacity_gpus": c.capacity,
            "policies": {p: policy_figures(c, p) for p in policies},
            "unallocated_gpus_per_seed": {p: [r.unallocated_gpus for r in c.results[p]] for p in policies},
        }
        if c.limits:
            figures["limit_per_seed"] = [
                {
                    "relaxation_unallocated_gpus": b.lowest_unallocated,
                    "hindsight_unallocated_gpus": b.hindsight_unallocated,
                    "hindsight_packing": b.hindsight.packer,
                }
                for b in c.limits
            ]
        return figures

    return {"visible": {c.name: case_json(c) for c in visible}, "mixes": {c.name: case_json(c) for c in mixes}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with the openb node and pod lists")
    parser.add_argument("--lists", default=",".join(VISIBLE), help="visible pod lists to replay ('' for none)")
    parser.add_argument("--mixes", type=int, default=20, help="generated mixes (default 20)")
    parser.add_argument("--first-mix", type=int, default=0, help="index of the first mix (default 0)")
    parser.add_argument("--mix", type=int, action="append", help="replay these mix indices instead of a range")
    parser.add_argument("--seeds", type=int, default=3, help="replays per policy and case (default 3)")
    parser.add_argument("--policy", action="append", help=f"policies (default: {', '.join(POLICIES)})")
    parser.add_argument("--ours", action="append", help="policies judged against fgd (default: default)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--oracle", action="store_true", help="hand every policy the whole list's popularity")
    parser.add_argument("--bound", action="store_true", help="also the limit of each replay (bench.bound)")
    args = parser.parse_args(argv)
    knowledge = Knowledge.ORACLE if args.oracle else Knowledge.LIVE
    ours = args.ours or ["default"]
    policies = list(dict.fromkeys([*(args.policy or POLICIES), *ours, BASELINE]))
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    base = read_tasks(args.data / "openb_pod_list_default.csv")
    visible = []
    for name in [n for n in args.lists.split(",") if n]:
        tasks = read_tasks(args.data / f"openb_pod_list_{name}.csv")
        visible.append(run_case(name, "full cluster", nodes, tasks, policies, args.seeds, knowledge, args.bound))
    mixes = []
    for index in args.mix or range(args.first_mix, args.first_mix + args.mixes):
        mix = make_mix(index, nodes, base)
        mixes.append(
            run_case(mix.name, mix.spec.label(), mix.nodes, mix.tasks, policies, args.seeds, knowledge, args.bound)
        )
    print(f"Knowledge: {knowledge} (what each policy is told of the workload).\n")
    print(render(visible, mixes, policies, ours))
    if args.json:
        args.json.write_text(json.dumps(as_json(visible, mixes, policies), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
