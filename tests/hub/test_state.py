"""Backup, restore and upgrade of the platform's state (hub/state.py), on the state a previous
release really left (tests/fixtures/previous_state: how it was made is in make.sh there)."""

import dbm
import json
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import pytest

from hub import recovery, state
from hub.cli import main
from hub.state import Kind, dbm_base, skipped
from market.store import Store
from portal.data.incident_store import IncidentStore
from spawner.incident_schema import SCHEMA_STEPS as INCIDENT_STEPS
from spawner.ledger import SCHEMA_STEPS, Ledger
from spawner.sqlite_schema import version

PREVIOUS = Path(__file__).parents[1] / "fixtures" / "previous_state" / "state-83b91fc.tar.gz"


def test_files_made_again_at_start_are_not_state() -> None:
    for name in ("jupyterhub.pid", "monitoring/prometheus.log", "ledger.sqlite-wal", "monitoring/web.yml"):
        assert skipped(PurePosixPath(name)), name
    assert skipped(PurePosixPath("monitoring/prometheus-data/wal/00000001"))
    assert skipped(PurePosixPath("backups/before-upgrade-1.tar.gz"))
    assert skipped(PurePosixPath("homes/amy/notebook.ipynb"))  # only with --homes
    for name in ("ledger.sqlite", "passwords.dbm.dat", "portal-hub-token", "monitoring/alertmanager-data/silences"):
        assert not skipped(PurePosixPath(name)), name


def test_a_dumb_dbm_is_one_piece_of_three_files() -> None:
    assert dbm_base(PurePosixPath("passwords.dbm.dat")) == PurePosixPath("passwords.dbm")
    assert dbm_base(PurePosixPath("passwords.dbm.dir")) == PurePosixPath("passwords.dbm")
    assert dbm_base(PurePosixPath("passwords.dbm")) == PurePosixPath("passwords.dbm")
    assert dbm_base(PurePosixPath("notes.dat")) is None


def test_the_timer_keeps_the_newest_dated_backups_and_nothing_else_is_touched() -> None:
    names = [state.dated_name(datetime(2026, 11, day, 3, 15, tzinfo=UTC)) for day in (3, 1, 2, 4)] + [
        "gpuslice-before-move.tar.gz",
        "notes.txt",
        "gpuslice-20261105T031500Z.tar.gz.partial",
    ]
    assert state.dated_name(datetime(2026, 11, 1, 3, 15, tzinfo=UTC)) == "gpuslice-20261101T031500Z.tar.gz"
    assert state.beyond_newest(names, 2) == ["gpuslice-20261101T031500Z.tar.gz", "gpuslice-20261102T031500Z.tar.gz"]
    assert state.beyond_newest(names, 10) == []


def _previous(tmp_path: Path) -> tuple[Path, Path]:
    """The previous release's settings and data folder, unpacked."""
    with tarfile.open(PREVIOUS) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data", tmp_path / "gpuslice.yaml"


def _rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    finally:
        db.close()


def _dbm(path: Path) -> dict[bytes, bytes]:
    with dbm.open(str(path), "r") as db:
        return {k: db[k] for k in db.keys()}  # noqa: SIM118


def test_the_pieces_of_a_real_state(tmp_path: Path) -> None:
    data, _ = _previous(tmp_path)
    kinds = {str(p.relative): p.kind for p in state.pieces(data)}
    assert kinds["jupyterhub.sqlite"] is Kind.SQLITE
    assert kinds["ledger.sqlite"] is Kind.SQLITE
    assert kinds["passwords.dbm"] is Kind.DBM
    assert kinds["invites.dbm"] is Kind.DBM
    assert kinds["jupyterhub_cookie_secret"] is Kind.FILE
    assert not any(k.startswith("homes/") for k in kinds)


@pytest.mark.process
def test_a_backup_restores_every_store_as_it_was(tmp_path: Path) -> None:
    data, settings = _previous(tmp_path / "old")
    archive = tmp_path / "backup.tar.gz"
    state.backup(data, settings, archive)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    restored = tmp_path / "new" / "data"
    state.restore(archive, restored)
    assert stat.S_IMODE(restored.stat().st_mode) == 0o700
    for name in ("jupyterhub.sqlite", "ledger.sqlite", "market.sqlite", "incidents.sqlite"):
        assert _rows(restored / name) == _rows(data / name), name
    for name in ("passwords.dbm", "invites.dbm"):
        assert _dbm(restored / name) == _dbm(data / name) != {}
    for name in ("jupyterhub_cookie_secret", "portal-hub-token"):
        assert (restored / name).read_bytes() == (data / name).read_bytes()
    assert state.archived_settings(archive) == settings.read_text()


@pytest.mark.process
def test_the_installed_alertmanagers_silences_are_backed_up_where_gpuslice_up_keeps_them(tmp_path: Path) -> None:
    data, settings = _previous(tmp_path / "old")
    account = tmp_path / "monitoring" / "alertmanager-data"  # the monitoring account's folder
    account.mkdir(parents=True)
    (account / "silences").write_bytes(b"\x01silence")
    archive = tmp_path / "backup.tar.gz"
    state.backup(data, settings, archive, alertmanager_data=account)
    state.restore(archive, tmp_path / "new")
    assert (tmp_path / "new" / "monitoring" / "alertmanager-data" / "silences").read_bytes() == b"\x01silence"


@pytest.mark.process
def test_restore_refuses_a_folder_in_use_and_a_damaged_backup(tmp_path: Path) -> None:
    data, settings = _previous(tmp_path / "old")
    archive = tmp_path / "backup.tar.gz"
    state.backup(data, settings, archive)
    with pytest.raises(state.StateError, match="not empty"):
        state.restore(archive, data)
    # --force moves the folder aside, never deletes it
    state.restore(archive, data, force=True)
    assert [p.name for p in data.parent.iterdir() if p.name.startswith("data.before-restore-")]
    damaged = tmp_path / "damaged.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(damaged, "w:gz") as dst:
        for member in src.getmembers():
            content = src.extractfile(member) if member.isfile() else None
            if member.name == "data/portal-hub-token" and content is not None:
                body = b"x" + content.read()[1:]
                member.size = len(body)
                import io

                dst.addfile(member, io.BytesIO(body))
            else:
                dst.addfile(member, content)
    with pytest.raises(state.StateError, match="checksum"):
        state.restore(damaged, tmp_path / "elsewhere")
    with pytest.raises(state.StateError, match="not a gpuslice backup"):
        state.read_manifest(settings)


@pytest.mark.process
def test_a_backup_taken_while_the_ledger_is_written_is_consistent(tmp_path: Path) -> None:
    data, settings = _previous(tmp_path / "old")
    ledger = Ledger(data / "ledger.sqlite")
    stop = threading.Event()
    written = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            ledger.record(f"u{n}/", "requested", 0, "a spawn")
            written.append(n)
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while len(written) < 20:  # the writer is under way
            assert writer.is_alive(), "the writer stopped"
            stop.wait(0.01)
        archive = tmp_path / "backup.tar.gz"
        state.backup(data, settings, archive)
    finally:
        stop.set()
        writer.join()
    restored = tmp_path / "new"
    state.restore(archive, restored)
    db = sqlite3.connect(restored / "ledger.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    copied = db.execute("SELECT COUNT(*) FROM server_event WHERE message = 'a spawn'").fetchone()[0]
    assert 20 <= copied <= len(written)


@pytest.mark.process
def test_the_previous_release_upgrades_in_place_keeping_everything(tmp_path: Path) -> None:
    data, settings = _previous(tmp_path)
    url = f"sqlite:///{data / 'market.sqlite'}"
    before = {name: _rows(data / name) for name in ("jupyterhub.sqlite", "market.sqlite", "incidents.sqlite")}
    stale = [s.name for s in state.store_statuses(data, url) if not s.current]
    assert stale == ["ledger", "incident store"]  # written before the stores were versioned
    saved = state.upgrade(data, settings, url, say=lambda _: None)
    assert saved is not None and saved.parent == data / "backups" and saved.exists()
    assert all(s.current for s in state.store_statuses(data, url))
    assert version(sqlite3.connect(data / "ledger.sqlite")) == len(SCHEMA_STEPS)
    assert version(sqlite3.connect(data / "incidents.sqlite")) == len(INCIDENT_STEPS)
    for name, rows in before.items():
        kept = _rows(data / name)
        assert {table: kept[table] for table in rows} == rows, name  # a migration adds tables, loses no row
    assert state.upgrade(data, settings, url, say=lambda _: None) is None  # current: nothing to do, no backup
    # what people had is still there, read by this release's code
    market = Store(url)
    assert any(image.status == "deprecated" for image in market.images())
    market.engine.dispose()
    recorded = IncidentStore(data / "incidents.sqlite").incidents()
    assert [r.incident.title for r in recorded] == ["GpuXidError on node localhost, gpu 0"]
    assert [n.text for n in IncidentStore(data / "incidents.sqlite").notes(recorded[0].incident.id)] == [
        "card reseated"
    ]


@pytest.mark.process
def test_an_upgrade_keeps_a_server_of_the_previous_release_running_with_its_slice(tmp_path: Path) -> None:
    """A server the previous release started runs through the upgrade, and the restarted hub's
    reconcile keeps its slice (it claims the server by the pid both recorded)."""
    data, settings = _previous(tmp_path)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # What the previous release recorded for amy's running server: the hub's spawner with its
        # pid, and the slice's row in the ledger as that release's schema had it.
        with sqlite3.connect(data / "jupyterhub.sqlite") as hub:
            hub.execute("INSERT INTO servers (id, proto, ip, port, base_url) VALUES (7, 'http', '127.0.0.1', 1, '/')")
            hub.execute(
                "UPDATE spawners SET server_id = 7, state = ? WHERE name = ''", (json.dumps({"pid": server.pid}),)
            )
        with sqlite3.connect(data / "ledger.sqlite") as ledger_db:
            ledger_db.execute(
                "INSERT INTO allocation (key, gpu_index, user, server, memory_bytes, whole, grp, pid, created)"
                " VALUES ('amy/', 0, 'amy', '', ?, 0, 'ml101', ?, ?)",
                (4 << 30, server.pid, time.time()),
            )
        url = f"sqlite:///{data / 'market.sqlite'}"
        assert state.upgrade(data, settings, url, say=lambda _: None) is not None
        assert server.poll() is None, "the upgrade stopped the server"
        ledger = Ledger(data / "ledger.sqlite")
        assert [(h.key, h.memory_bytes, h.pid) for h in ledger.holdings()] == [("amy/", 4 << 30, server.pid)]
        assert recovery.reconcile(ledger, data / "jupyterhub.sqlite", say=lambda _: None) == []  # nothing released
        assert [h.key for h in ledger.holdings()] == ["amy/"] and server.poll() is None
    finally:
        server.kill()
        server.wait()


@pytest.mark.process
def test_the_commands_back_up_and_restore_onto_a_fresh_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _previous(tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    assert main(["backup", str(tmp_path / "b.tar.gz"), "--config", "gpuslice.yaml"]) == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    monkeypatch.chdir(fresh)
    assert main(["restore", str(tmp_path / "b.tar.gz")]) == 0
    assert (fresh / "gpuslice.yaml").read_text() == (tmp_path / "old" / "gpuslice.yaml").read_text()
    assert _rows(fresh / "data" / "jupyterhub.sqlite") == _rows(tmp_path / "old" / "data" / "jupyterhub.sqlite")
    assert main(["restore", str(tmp_path / "b.tar.gz")]) == 2  # not over what is there now
