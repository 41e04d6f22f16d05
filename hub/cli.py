"""The `gpuslice` command."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hub import settings as settings_mod
from spawner import environ
from spawner.placement import POLICIES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuslice", description="GPU notebook platform with GPU slices.")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start the single-machine platform")
    up.add_argument(
        "--config", type=Path, help="settings file (YAML; default ./gpuslice.yaml where it exists); see examples/"
    )

    classes = commands.add_parser("class", help="manage classes (groups of students with GPU rules)")
    class_commands = classes.add_subparsers(dest="class_command", required=True)
    add = class_commands.add_parser("add", help="add or update a class from a roster CSV")
    add.add_argument("name", help="the class (group) name, for example ml101")
    add.add_argument("roster", type=Path, help="CSV with a 'username' column, or user names in the first column")
    add.add_argument(
        "--config",
        type=Path,
        default=settings_mod.DEFAULT_CONFIG,
        help="settings file to update (default ./gpuslice.yaml, which gpuslice up reads)",
    )
    add.add_argument("--max-slice", help='largest slice per server, for example "4GiB"')
    add.add_argument("--budget", help='GPU memory the whole class may hold at once, for example "40GiB"')
    add.add_argument("--servers-per-user", type=int, help="running servers per student")
    add.add_argument("--max-gpus", type=int, help="whole cards per server (0: none)")

    exporter = commands.add_parser("exporter", help="serve GPU metrics (dcgm-exporter names) on /metrics")
    exporter.add_argument("--port", type=int, default=9400, help="port on 127.0.0.1 (default 9400)")
    exporter.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    exporter.add_argument("--simulate", help="GPU spec to simulate when NVML finds no GPU, e.g. 2x16GiB:T4")
    exporter.add_argument("--ledger", type=Path, help="the hub's ledger: simulated GPUs follow its slices")
    exporter.add_argument("--faults", type=Path, help="JSON list of faults to inject into simulated GPUs")
    exporter.add_argument("--hostname", help=f"the Hostname label (default: ${environ.NODE_NAME.name} or localhost)")

    ext = commands.add_parser("scheduler-extender", help="kube-scheduler extender (filter, prioritize, bind)")
    ext.add_argument("--port", type=int, default=8888, help="port (default 8888)")
    ext.add_argument(
        "--address", default="127.0.0.1", help="address (default 127.0.0.1: only kube-scheduler in the same pod)"
    )
    ext.add_argument("--backend", choices=["gpushare", "hami", "whole"], required=True, help="the GPU sharing backend")
    ext.add_argument("--policy", choices=POLICIES, default="default", help="placement policy (default: default)")
    ext.add_argument("--api-server", help="Kubernetes API URL (default: in-cluster, with the service account)")

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
    spawn = benches.add_parser("spawn", help="spawn-to-ready time, gpuslice vs plain JupyterHub")
    spawn.add_argument("--runs", type=int, default=5, help="timed spawns per hub (default 5)")
    klass = benches.add_parser("class", help="N users start servers at once, gpuslice vs plain JupyterHub")
    klass.add_argument("--users", type=int, default=50, help="students pressing Start together (default 50)")
    klass.add_argument(
        "--portal-sessions",
        type=int,
        default=0,
        help="browser sessions (headless Chromium) refreshing the portal while gpuslice's class spawns (default 0)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args.config)
    if args.command == "class":
        return _class_add(args)
    if args.command == "exporter":
        return _exporter(args)
    if args.command == "scheduler-extender":
        return _scheduler_extender(args)
    if args.bench == "spawn":
        with _bench_extra():
            from bench.spawn import run

        print(json.dumps(run(args.runs), indent=2))
        return 0
    if args.bench == "class":
        with _bench_extra():
            from bench.classroom import run as run_class

        print(json.dumps(run_class(args.users, args.portal_sessions), indent=2))
        return 0
    return _bench_placement(args)


BENCH_EXTRA = "pip install -e '.[bench]'"


@contextlib.contextmanager
def _bench_extra() -> Iterator[None]:
    """The benchmarks' own dependencies (psutil, playwright) come with the bench extra: say so."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("bench", "psutil", "playwright"):
            raise SystemExit(f"gpuslice bench needs the bench extra ({exc.name} is missing): {BENCH_EXTRA}") from None
        raise


def _class_add(args: argparse.Namespace) -> int:
    from hub.classes import add_class, read_roster

    rules = {
        "max_slice": args.max_slice,
        "budget": args.budget,
        "servers_per_user": args.servers_per_user,
        "max_gpus": args.max_gpus,
    }
    try:
        members = read_roster(args.roster)
        add_class(args.config, args.name, members, rules)
    except settings_mod.SettingsError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    written = args.config.absolute()
    if written == settings_mod.DEFAULT_CONFIG.absolute():
        how = "`gpuslice up` run in this folder reads it"
    else:
        how = f"start with `gpuslice up --config {written}` to apply it"
    print(f"class {args.name}: {len(members)} students written to {written}; {how} (a running hub: restart it).")
    return 0


def _exporter(args: argparse.Namespace) -> int:
    from hub.exporter import GpuCollector, default_hostname, registry_for, serve, source_for

    try:
        source, name = source_for(args.simulate, args.ledger, args.faults)
    except ValueError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    collector = GpuCollector(source, name, args.hostname or default_hostname())
    print(f"gpuslice exporter: {name} GPUs on http://{args.address}:{args.port}/metrics", flush=True)
    serve(registry_for(collector), args.port, args.address)
    return 0


def _scheduler_extender(args: argparse.Namespace) -> int:
    from hub.extender import RestKubeClient, serve
    from spawner.backends import Backend

    try:
        client = RestKubeClient(args.api_server) if args.api_server else RestKubeClient.in_cluster()
    except (RuntimeError, OSError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    print(
        f"gpuslice scheduler-extender: {args.policy} on {args.backend}, http://{args.address}:{args.port}", flush=True
    )
    serve(client, Backend(args.backend), args.policy, args.address, args.port)
    return 0


def _bench_placement(args: argparse.Namespace) -> int:
    from bench.placement import TraceError, bench, read_nodes, read_tasks  # bench sits above hub: import on use

    if args.seeds < 1:
        print("gpuslice: --seeds must be at least 1", file=sys.stderr)
        return 2
    try:
        nodes = read_nodes(args.nodes)
        tasks = read_tasks(args.pods)
    except TraceError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    result = bench(nodes, tasks, args.policy or list(POLICIES), args.seeds)
    print(json.dumps(result, indent=2))
    return 0


def _up(config: Path | None) -> int:
    from hub.platform import PlatformError, up

    config = settings_mod.config_path(config)
    if config is not None:
        print(f"gpuslice: settings from {config.absolute()}", file=sys.stderr)
    try:
        settings = settings_mod.load(config)
        return up(settings, config)
    except (settings_mod.SettingsError, PlatformError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
