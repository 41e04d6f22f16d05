"""`gpuslice bench ...`: the benchmarks register their own subcommand.

The `gpuslice` command (hub/cli.py) sits below the benchmarks and never imports them: it
calls every ``register`` named under the ``gpuslice.commands`` entry-point group
(pyproject.toml), and this one adds ``bench`` with its subcommands. Each subcommand's
module is imported only when it runs, so `gpuslice --help` costs nothing here, and a
missing bench extra (psutil, Playwright) is named with the command that installs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spawner.placement import POLICIES

BENCH_EXTRA = "pip install -e '.[bench]'"


def register(commands: Any) -> None:
    """Add ``bench`` to the `gpuslice` command's subcommands (an argparse subparsers action)."""
    bench_parser = commands.add_parser("bench", help="benchmarks")
    benches = bench_parser.add_subparsers(dest="bench", required=True)
    placement = benches.add_parser("placement", help="replay a cluster trace through placement policies")
    placement.add_argument(
        "--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    placement.add_argument("--pods", type=Path, required=True, help="pod list CSV (name,cpu_milli,...,gpu_spec)")
    placement.add_argument(
        "--policy", action="append", choices=POLICIES, help="a policy to replay (repeatable; default: all)"
    )
    placement.add_argument("--seeds", type=int, default=1, help="replays per policy, seeds 0..N-1 (default 1)")
    placement.add_argument("--json", action="store_true", help="print JSON (the only format for now)")
    placement.add_argument(
        "--oracle", action="store_true", help="tell each policy the whole list's popularity (default: arrivals so far)"
    )
    placement.add_argument("--bound", action="store_true", help="also the limit: the relaxation and hindsight packing")
    placement.set_defaults(run=_placement)
    spawn = benches.add_parser("spawn", help="spawn-to-ready time, gpuslice vs plain JupyterHub")
    spawn.add_argument("--runs", type=int, default=5, help="timed spawns per hub (default 5)")
    spawn.set_defaults(run=_spawn)
    klass = benches.add_parser("class", help="N users start servers at once, gpuslice vs plain JupyterHub")
    klass.add_argument("--users", type=int, default=50, help="students pressing Start together (default 50)")
    klass.add_argument(
        "--portal-sessions",
        type=int,
        default=0,
        help="browser sessions (headless Chromium) refreshing the portal while gpuslice's class spawns (default 0)",
    )
    klass.add_argument(
        "--browsers-apart",
        action="store_true",
        help="run the sessions' browsers in a cgroup of their own, one share of the CPU (root; default: beside"
        " the platform, each browser process weighing as much as the hub)",
    )
    klass.set_defaults(run=_class)
    alerts = benches.add_parser("alerts", help="replay a simulated week with injected faults through the alert rules")
    alerts.add_argument("--days", type=float, default=7.0, help="days to simulate (default 7)")
    alerts.add_argument("--seed", type=int, default=11, help="random seed (default 11; seed 1 debugged the generator)")
    alerts.add_argument("--faults-per-kind", type=int, default=3, help="injected faults of each shape (default 3)")
    alerts.set_defaults(run=_alerts)
    day = benches.add_parser("class-day", help="a simulated teaching day: retry vs the waiting line vs reclaiming")
    day.add_argument(
        "--design-seeds", action="store_true", help="run the seeds the model was designed on (1-5), not 101-120"
    )
    day.add_argument("--json", action="store_true", help="print JSON instead of the table")
    day.add_argument(
        "--validate",
        action="store_true",
        help="live a short day on the real platform (a hub, servers, the line, the reclaimer) beside the model",
    )
    day.add_argument(
        "--sweep",
        metavar="FIELD=V1,V2,...",
        help="line+reclaim against retry with one number of the day varied, e.g. gpu_idle_timeout=15,10,5 (minutes)",
    )
    day.add_argument("--seed", type=int, default=101, help="with --validate: the day's seed (default 101)")
    day.add_argument(
        "--scale", type=float, default=3.0, help="with --validate: real seconds per model minute (default 3)"
    )
    day.set_defaults(run=_class_day)
    jobs = benches.add_parser(
        "jobs", help="batch jobs: overhead against running directly, a long queue, backfill nights"
    )
    jobs.add_argument(
        "--part",
        action="append",
        choices=("overhead", "queue", "night"),
        help="one of the three measurements (repeatable; default: all three)",
    )
    jobs.add_argument("--job-seconds", type=float, default=30.0, help="(1) the job's length (default 30)")
    jobs.add_argument(
        "--runs", type=int, default=3, help="(1) runs through the platform and directly, each (default 3)"
    )
    jobs.add_argument("--seeds", type=int, default=10, help="(3) days and nights lived, seeds 101.. (default 10)")
    jobs.add_argument("--json", action="store_true", help="print JSON instead of the lines")
    jobs.set_defaults(run=_jobs)


@contextlib.contextmanager
def _bench_extra() -> Iterator[None]:
    """The benchmarks' own dependencies (psutil, playwright) come with the bench extra: say so."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("bench", "psutil", "playwright", "scipy"):
            raise SystemExit(f"gpuslice bench needs the bench extra ({exc.name} is missing): {BENCH_EXTRA}") from None
        raise


def _spawn(args: argparse.Namespace) -> int:
    with _bench_extra():
        from bench.spawn import run

    print(json.dumps(run(args.runs), indent=2))
    return 0


def _class(args: argparse.Namespace) -> int:
    with _bench_extra():
        from bench.classroom import run

    print(json.dumps(run(args.users, args.portal_sessions, args.browsers_apart), indent=2))
    return 0


def _alerts(args: argparse.Namespace) -> int:
    from bench.alerts import main

    return main(["--days", str(args.days), "--seed", str(args.seed), "--faults-per-kind", str(args.faults_per_kind)])


def _class_day(args: argparse.Namespace) -> int:
    if args.validate:
        with _bench_extra():
            from bench.classday_real import report as report_real
            from bench.classday_real import validate

        checked = validate(args.seed, scale_s=args.scale)
        print(json.dumps(checked, indent=2) if args.json else report_real(checked))
        return 0
    from bench.classday import DESIGN_SEEDS, REPORT_SEEDS, report, report_sweep, run, sweep

    seeds = DESIGN_SEEDS if args.design_seeds else REPORT_SEEDS
    if args.sweep:
        name, values = sweep_argument(args.sweep)
        try:
            result = sweep(name, values, seeds)
        except ValueError as exc:
            raise SystemExit(f"gpuslice bench class-day --sweep: {exc}") from None
        print(json.dumps(result, indent=2) if args.json else report_sweep(result))
        return 0
    result = run(seeds)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


def _jobs(args: argparse.Namespace) -> int:
    from bench.jobs import overhead, queue, report
    from bench.jobs_night import run as night

    parts = args.part or ["overhead", "queue", "night"]
    result: dict[str, Any] = {}
    if "queue" in parts:
        result["queue"] = queue()
    if "night" in parts:
        result["night"] = night(tuple(range(101, 101 + args.seeds)))
    if "overhead" in parts:
        with _bench_extra():
            result["overhead"] = overhead(args.job_seconds, args.runs)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


def sweep_argument(text: str) -> tuple[str, list[float]]:
    """``FIELD=V1,V2,...`` as a name and its numbers, or exit saying how to write it."""
    name, _, listed = text.partition("=")
    try:
        values = [float(v) for v in listed.split(",") if v.strip()]
    except ValueError:
        values = []
    if not name.strip() or not values:
        raise SystemExit(
            f"gpuslice bench class-day --sweep {text!r}: write FIELD=V1,V2,..., e.g. gpu_idle_timeout=15,10,5"
        )
    return name.strip(), values


def _placement(args: argparse.Namespace) -> int:
    from bench.placement import Knowledge, TraceError, bench, read_nodes, read_tasks

    if args.seeds < 1:
        print("gpuslice: --seeds must be at least 1", file=sys.stderr)
        return 2
    try:
        nodes = read_nodes(args.nodes)
        tasks = read_tasks(args.pods)
    except TraceError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    knowledge = Knowledge.ORACLE if args.oracle else Knowledge.LIVE
    result = bench(nodes, tasks, args.policy or list(POLICIES), args.seeds, knowledge)
    if args.bound:
        with _bench_extra():
            from bench.bound import add_limit  # the relaxation needs scipy (the bench extra)
        add_limit(result, nodes, tasks, args.seeds)
    print(json.dumps(result, indent=2))
    return 0
