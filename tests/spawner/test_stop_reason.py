"""Who stopped a local server, as the spawner's stop() words it (the culler's timeout, not the reclaimer's)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from spawner.ledger import Ledger
from tests.spawner.test_restart_check import LoadedSpawner


def _idle_for(tmp_path: Path, minutes: int) -> LoadedSpawner:
    # The reclaimer's 15 min and the culler's hour are different clocks (both set, as gpuslice up sets them).
    spawner = LoadedSpawner(
        gpu_ledger_path=str(tmp_path / "ledger.sqlite"), gpu_culler_timeout=3600, gpu_idle_timeout=900
    )
    last = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=minutes)  # naive UTC, as the hub's database
    spawner.orm_spawner = SimpleNamespace(last_activity=last, server=None)
    Ledger(spawner.gpu_ledger_path).record("ann/", "started", 50, "server process started")
    return spawner


def test_a_server_idle_past_the_reclaim_timeout_but_not_the_cullers_was_not_culled(tmp_path: Path) -> None:
    kind, _, message = _idle_for(tmp_path, 20)._stop_reason()
    assert kind == "stopped" and message.startswith("stopped from the hub"), message


def test_a_server_idle_past_the_cullers_timeout_was_culled(tmp_path: Path) -> None:
    assert _idle_for(tmp_path, 61)._stop_reason()[2] == "stopped by the idle culler: no activity for 61 min"


def test_the_reclaimers_stop_is_told_at_the_next_start_once_the_server_runs_again(tmp_path: Path) -> None:
    """Its note before the stop (written on both backends) is the notice; a server stopped by its owner has none."""
    spawner = _idle_for(tmp_path, 5)
    assert spawner.gpu_reclaim_stop() is None
    ledger = Ledger(spawner.gpu_ledger_path)
    ledger.record("ann/", "warned", 100, "nobody there while others wait for a GPU: stops at ... unless used")
    ledger.record("ann/", "stopping", 90, "the GPU line's reclaimer: nobody there while others waited")
    ledger.record("ann/", "stopped", 100, "stopped by the GPU line's reclaimer: nobody there while others waited")
    for kind in ("requested", "placed", "started"):  # the next start
        ledger.record("ann/", kind, 50, kind)
    said = spawner.gpu_reclaim_stop()
    assert said is not None and said[0].startswith("Stopped at ")
    assert said[0].endswith(
        "by the GPU line's reclaimer: nobody there while others waited. What you had open is open again."
    )
    assert len(said[0]) <= 140  # JupyterLab's notification shows no more
    ledger.record("ann/", "stopping", 90, "ann in the portal")  # a later stop by someone else: still the reclaimer's
    assert spawner.gpu_reclaim_stop() == said
