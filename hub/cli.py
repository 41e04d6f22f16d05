"""The `gpuslice` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hub import settings as settings_mod
from spawner.gpus import parse_gpu_spec
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
    try:
        settings = settings_mod.load(config)
    except settings_mod.SettingsError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    gpus = ", ".join(str(e) for e in parse_gpu_spec(settings.simulate))
    print(
        "gpuslice up: the single-machine platform is not built yet (issue 3); this is its plan.\n"
        f"  settings:      {settings.source}\n"
        f"  hub:           http://127.0.0.1:{settings.port}/hub/ (JupyterHub + configurable-http-proxy)\n"
        f"  data folder:   {settings.data_dir}\n"
        f"  admins:        {', '.join(settings.admin_users) or '(none)'}\n"
        f"  GPUs:          NVML if present, else simulated: {gpus}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
