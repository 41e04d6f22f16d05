"""The `gpuslice` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hub import settings as settings_mod
from spawner.placement import POLICIES
from spawner.simulate import TraceError, bench, read_nodes, read_tasks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuslice", description="GPU notebook platform with GPU slices.")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start the single-machine platform")
    up.add_argument("--config", type=Path, help="settings file (YAML); see examples/gpuslice.yaml")

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args.config)
    return _bench_placement(args)


def _bench_placement(args: argparse.Namespace) -> int:
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

    try:
        settings = settings_mod.load(config)
        return up(settings, config)
    except (settings_mod.SettingsError, PlatformError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
