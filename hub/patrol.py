"""`gpuslice patrol`: a short health check of each free card, on a schedule (spawner/patrol.py says what it is).

    gpuslice patrol run [--once]     # each card nobody holds, checked and recorded now, then each as it falls due
    gpuslice patrol status           # each card's last check, and which are out of placement
    gpuslice patrol clear GPU        # an admin puts a card back in placement

A card is held in the ledger for its check (``patrol/gpu-N``, a whole card, taken only if nobody holds
any of it, in the ledger's one transaction), so nobody is placed there meanwhile; then released. On a
real GPU the check is a memory and compute test in a process of its own (``REAL_CHECK``); on simulated
GPUs a simulated one, failed where the exporter's faults file injects a fault for the card. The results
are in the ledger (spawner/card_health.py), served at /hub/metrics as ``gpuslice_patrol_healthy`` and
``gpuslice_patrol_checked_timestamp_seconds`` (hub/metrics.py), alerted on as ``GpuPatrolFailed``.
The single machine runs it as the hub's ``gpu-patrol`` service (hub/jupyterhub_config.py); the commands
act on the ledger as the platform's account does (root, on the hub's machine).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spawner.card_health import CardLedger
from spawner.gpus import machine
from spawner.inventory import Gpu
from spawner.ledger import Held
from spawner.patrol import (
    DEFAULT_INTERVAL_S,
    REAL_CHECK,
    RETRY_HELD_S,
    Check,
    due_cards,
    free_cards,
    next_patrol_in,
    patrol_key,
    simulated_check,
)

log = logging.getLogger("gpuslice.patrol")
REAL_CHECK_TIMEOUT_S = 300


def hold(ledger: CardLedger, gpu: Gpu) -> bool:
    """Take the whole card for its check, if nobody holds any of it (atomic); whether it was taken."""

    def decide(holds: list[Held]) -> list[Held] | None:
        if any(h.gpu_index == gpu.index for h in holds):
            return None
        return [Held(patrol_key(gpu.index), gpu.index, "patrol", f"gpu-{gpu.index}", gpu.memory_bytes, True)]

    return ledger.allocate(patrol_key(gpu.index), decide) is not None


def real_check(gpu: Gpu, now: float) -> Check:
    """The memory and compute test on a real card, in a process that sees that card only."""
    env = {"CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", REAL_CHECK], env=env, capture_output=True, text=True, timeout=REAL_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return Check(gpu.index, False, f"the memory and compute test did not finish in {REAL_CHECK_TIMEOUT_S} s", now)
    said = (done.stdout.strip() or done.stderr.strip()[-300:] or f"exit status {done.returncode}").splitlines()[-1]
    return Check(gpu.index, done.returncode in (0, 2), said, now)


def faults(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    loaded = json.loads(path.read_text() or "[]")
    return [f for f in loaded if isinstance(f, dict)]


def patrol_once(
    ledger: CardLedger,
    gpus: Sequence[Gpu],
    check: Callable[[Gpu, float], Check],
    now: Callable[[], float] = time.time,
    interval_s: float | None = None,
) -> list[Check]:
    """Each free card held, checked, released and its result recorded; the checks made.

    With ``interval_s``: only the cards due (never checked, or last checked that long ago).
    """
    held = [h.gpu_index for h in ledger.holdings()]
    cards = free_cards(gpus, held) if interval_s is None else due_cards(gpus, held, ledger.health(), now(), interval_s)
    made = []
    for index in cards:
        gpu = next(g for g in gpus if g.index == index)
        if not hold(ledger, gpu):
            continue  # someone took it since the listing: it is checked next time
        try:
            result = check(gpu, now())
        finally:
            ledger.release(patrol_key(gpu.index))
        recorded = ledger.record_check(result)
        made.append(result)
        log.info("gpuslice patrol: GPU %s %s: %s", gpu.index, "healthy" if recorded.healthy else "OUT", result.message)
    return made


def checker(gpus: Sequence[Gpu], faults_file: Path | None) -> Callable[[Gpu, float], Check]:
    if gpus and all(g.simulated for g in gpus):
        return lambda gpu, now: simulated_check(gpu, faults(faults_file), now)
    return real_check


def add_command(commands: Any) -> None:
    patrol = commands.add_parser("patrol", help="health checks of free cards; cards taken out of placement")
    patrol.add_argument("--config", type=Path, help="settings file (default ./gpuslice.yaml where it exists)")
    sub = patrol.add_subparsers(dest="patrol_command", required=True)
    run_ = sub.add_parser("run", help="check each free card now, then each again --interval after its last check")
    run_.add_argument("--once", action="store_true", help="check once and exit")
    run_.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="a card's checks apart (6 h)")
    sub.add_parser("status", help="each card's last check")
    clear = sub.add_parser("clear", help="put a card a patrol took out back in placement (an admin's call)")
    clear.add_argument("gpu", type=int, help="the card's index")


def run(args: argparse.Namespace) -> int:
    from hub import settings as settings_mod  # the command's only: the service is given its paths

    settings = settings_mod.load(settings_mod.config_path(args.config))
    data_dir = settings.data_dir.absolute()
    ledger = CardLedger(data_dir / "ledger.sqlite")
    if args.patrol_command == "status":
        for card in ledger.health():
            state = "healthy" if card.healthy else "OUT OF PLACEMENT"
            cleared = f" (cleared by {card.cleared_by})" if card.cleared_by else ""
            print(f"GPU {card.gpu}: {state}{cleared}: {card.message}")
        return 0
    if args.patrol_command == "clear":
        if ledger.clear(args.gpu, getpass.getuser()):
            print(f"GPU {args.gpu} is back in placement.")
            return 0
        print(f"GPU {args.gpu} was not out of placement.", file=sys.stderr)
        return 1
    gpus = machine(settings.simulate).gpus
    check = checker(gpus, data_dir / "monitoring" / "faults.json")
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    patrol_once(ledger, gpus, check)  # an admin's command: every free card, now
    if args.once:
        return 0
    patrol_forever(ledger, gpus, check, args.interval)
    return 0


def patrol_forever(
    ledger: CardLedger,
    gpus: Sequence[Gpu],
    check: Callable[[Gpu, float], Check],
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Each card checked as it falls due (its last check, in the ledger, ``interval_s`` ago), until
    interrupted: a restart keeps the schedule instead of checking every free card again."""
    while True:
        pause = min(RETRY_HELD_S, interval_s)
        try:
            patrol_once(ledger, gpus, check, interval_s=interval_s)
            pause = next_patrol_in(gpus, ledger.health(), time.time(), interval_s)
        except Exception:  # one failed patrol is not the last
            log.exception("gpuslice patrol: a patrol failed; trying again in %.0f s", pause)
        sleep(pause)


def main(argv: list[str] | None = None) -> None:
    """As the hub's ``gpu-patrol`` managed service: ``python -m hub.patrol --ledger FILE --simulate SPEC ...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--simulate", default="")
    parser.add_argument("--faults", type=Path)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    ledger, gpus = CardLedger(args.ledger), machine(args.simulate).gpus
    check = checker(gpus, args.faults)
    try:
        patrol_forever(ledger, gpus, check, args.interval)
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        return


if __name__ == "__main__":
    main()
