"""The platform's state on disk: backed up while it runs, restored on a fresh machine, upgraded.

The state is what gpuslice wrote into its data folder and cannot make again: JupyterHub's
database (users, groups, servers, tokens), the ledger (allocations, the GPU line, waits),
the markets (when they are a SQLite file), the incident store, passwords and invite codes,
the cookie secret, the services' tokens, the monitoring password and Alertmanager's silences;
and the settings file. Left out, because the platform makes them again at start: pid files,
logs, SQLite's side files, the Prometheus and Alertmanager configs, the users' Python
environment. Left out unless asked: users' home folders (``--homes``: they can be large, and
most sites back up /home already) and Prometheus's metric history (its own folder; copy it with
Prometheus stopped, or keep it in your file backup).

A backup is one tar.gz, mode 0600, with ``manifest.json`` listing every file, its kind and
SHA-256. SQLite files are copied with SQLite's online backup API (a consistent copy while the
hub writes), dbm files through dbm itself; everything else as bytes.

``upgrade`` brings every store to this release: JupyterHub's database with JupyterHub's own
``upgrade-db``, the markets with Alembic, gpuslice's SQLite stores by their versioned steps
(spawner/sqlite_schema.py). It takes a backup first whenever something will change.
"""

from __future__ import annotations

import dbm
import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path, PurePosixPath

FORMAT = 1  # of the archive; restore refuses a format it does not know
MANIFEST = "manifest.json"
DATA = PurePosixPath("data")
SETTINGS = PurePosixPath("settings/gpuslice.yaml")
HOMES = PurePosixPath("homes")
BACKUPS_DIR = "backups"  # in the data folder: upgrade's own backups (never inside a backup)
SQLITE_MAGIC = b"SQLite format 3\x00"
DATED = "gpuslice-{}.tar.gz"  # a backup made into a folder (the backup timer's), by its UTC time
DATED_PATTERN = re.compile(r"gpuslice-\d{8}T\d{6}Z\.tar\.gz")

# Made again at every start, or too large and kept elsewhere (see the module's docstring).
SKIPPED_DIRS = {"prometheus-data", BACKUPS_DIR, "homes"}
SKIPPED_SUFFIXES = (".pid", ".log", "-wal", "-shm", "-journal")
SKIPPED_NAMES = {"prometheus.yml", "alertmanager.yml", "web.yml", "faults.json"}
DUMB_DBM_SUFFIXES = (".dat", ".dir", ".bak")


class StateError(RuntimeError):
    """A backup, restore or upgrade that cannot go on; the message says what to do."""


class Kind(StrEnum):
    SQLITE = "sqlite"
    DBM = "dbm"
    FILE = "file"


@dataclass(frozen=True)
class Piece:
    """One file (or dbm database) of the state, by its path relative to the data folder."""

    relative: PurePosixPath
    kind: Kind


def skipped(relative: PurePosixPath) -> bool:
    """Files the platform makes again at start, or keeps elsewhere (pure: by name only)."""
    if any(part in SKIPPED_DIRS for part in relative.parts[:-1]) or relative.parts[0] in SKIPPED_DIRS:
        return True
    return relative.name in SKIPPED_NAMES or relative.name.endswith(SKIPPED_SUFFIXES)


def dbm_base(relative: PurePosixPath) -> PurePosixPath | None:
    """``passwords.dbm`` for ``passwords.dbm.dat`` (Python's dumb dbm keeps three files), else None."""
    if relative.suffix in DUMB_DBM_SUFFIXES and relative.stem.endswith(".dbm"):
        return relative.with_suffix("")
    return relative if relative.suffix == ".dbm" else None


def pieces(data_dir: Path) -> list[Piece]:
    """Every piece of the state in ``data_dir``, each once, in a stable order."""
    found: dict[PurePosixPath, Kind] = {}
    for path in sorted(data_dir.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        relative = PurePosixPath(path.relative_to(data_dir).as_posix())
        if skipped(relative):
            continue
        base = dbm_base(relative)
        if base is not None:
            found[base] = Kind.DBM
        elif _is_sqlite(path):
            found[relative] = Kind.SQLITE
        else:
            found[relative] = Kind.FILE
    return [Piece(relative, kind) for relative, kind in found.items()]


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


# -- backup -----------------------------------------------------------------------------------


def _copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy while others write (SQLite's online backup API; WAL included)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _copy_dbm(source: Path, target: Path) -> None:
    with dbm.open(str(source), "r") as src, dbm.open(str(target), "n", 0o600) as dst:
        for key in src.keys():  # noqa: SIM118  (gdbm's objects cannot be iterated)
            dst[key] = src[key]


def _copy(piece: Piece, data_dir: Path, into: Path) -> None:
    source, target = data_dir / piece.relative, into / piece.relative
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if piece.kind is Kind.SQLITE:
        _copy_sqlite(source, target)
    elif piece.kind is Kind.DBM:
        _copy_dbm(source, target)
    else:
        shutil.copy2(source, target)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tree_files(root: Path) -> Iterator[Path]:
    return (p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


def gpuslice_version() -> str:
    try:
        return package_version("gpuslice")
    except PackageNotFoundError:
        return "unknown"


ALERTMANAGER_DATA = PurePosixPath("monitoring/alertmanager-data")  # its silences and notification log


def backup(
    data_dir: Path,
    settings_file: Path | None,
    out: Path,
    homes: dict[str, Path] | None = None,
    alertmanager_data: Path | None = None,
) -> dict[str, int]:
    """Write the state of ``data_dir`` (and ``settings_file``, and each user's home in ``homes``)
    to the archive ``out`` (0600). Returns the count of files by kind. ``alertmanager_data``:
    Alertmanager's folder where it is not the data folder's (the installed platform's monitoring
    account keeps it): archived where `gpuslice up` keeps it, ``monitoring/alertmanager-data``."""
    data_dir = data_dir.absolute()
    if not (data_dir / "jupyterhub.sqlite").exists():
        raise StateError(f"{data_dir} holds no gpuslice state (no jupyterhub.sqlite): give --config of the platform")
    with tempfile.TemporaryDirectory(prefix="gpuslice-backup-") as tmp:
        staging = Path(tmp)
        listed = pieces(data_dir)
        for piece in listed:
            _copy(piece, data_dir, staging / DATA)
        if alertmanager_data is not None and alertmanager_data.is_dir():
            extra = [Piece(ALERTMANAGER_DATA / p.name, Kind.FILE) for p in alertmanager_data.iterdir() if p.is_file()]
            for piece in extra:
                target = staging / DATA / piece.relative
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                shutil.copy2(alertmanager_data / piece.relative.name, target)
            listed += extra
        if settings_file is not None:
            (staging / SETTINGS).parent.mkdir(parents=True)
            shutil.copy2(settings_file, staging / SETTINGS)
        for user, home in (homes or {}).items():
            if home.is_dir():
                shutil.copytree(home, staging / HOMES / user, symlinks=True)
        manifest = {
            "format": FORMAT,
            "gpuslice": gpuslice_version(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "data_dir": str(data_dir),
            "kinds": {str(p.relative): p.kind.value for p in listed},
            "homes": sorted(homes or {}),
            "files": {path.relative_to(staging).as_posix(): _sha256(path) for path in _tree_files(staging)},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _write_archive(staging, out)
    counts: dict[str, int] = {}
    for piece in listed:
        counts[piece.kind.value] = counts.get(piece.kind.value, 0) + 1
    counts["homes"] = len(homes or {})
    return counts


def dated_name(now: datetime) -> str:
    """The name of a backup made into a folder at ``now``: they sort by time."""
    return DATED.format(now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ"))


def beyond_newest(names: list[str], keep: int) -> list[str]:
    """The dated backups among ``names`` older than the newest ``keep`` (pure; no other file is ever listed)."""
    dated = sorted(n for n in names if DATED_PATTERN.fullmatch(n))
    return dated[: max(0, len(dated) - keep)]


def _write_archive(staging: Path, out: Path) -> None:
    """tar.gz of ``staging`` at ``out``, readable by its owner only from the first byte."""
    out = out.absolute()
    partial = out.with_name(out.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path in sorted(staging.rglob("*")):
            tar.add(path, arcname=path.relative_to(staging).as_posix(), recursive=False)
    partial.replace(out)


# -- restore ----------------------------------------------------------------------------------


def read_manifest(archive: Path) -> dict[str, object]:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            manifest: dict[str, object] = json.load(io.TextIOWrapper(member))
    except (OSError, tarfile.TarError, KeyError, json.JSONDecodeError) as exc:
        raise StateError(f"{archive}: not a gpuslice backup ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise StateError(f"{archive}: backup format {manifest.get('format')!r}; this gpuslice reads format {FORMAT}")
    return manifest


def archived_settings(archive: Path) -> str | None:
    """The settings file kept in ``archive`` (None: the platform ran on the defaults)."""
    with tarfile.open(archive, "r:gz") as tar:
        try:
            member = tar.extractfile(str(SETTINGS))
        except KeyError:
            return None
        return member.read().decode() if member else None


def restore(archive: Path, data_dir: Path, *, force: bool = False) -> tuple[dict[str, object], Path]:
    """Unpack ``archive``'s state into ``data_dir`` (which must be empty or absent, unless ``force``:
    then it is moved aside, never deleted). Returns the manifest and the folder holding the users'
    homes, unpacked (the caller gives each to its account)."""
    manifest = read_manifest(archive)
    data_dir = data_dir.absolute()
    if data_dir.exists() and any(data_dir.iterdir()):
        if not force:
            raise StateError(
                f"{data_dir} is not empty: restore onto a fresh data folder, or add --force "
                "(the folder is then moved aside, not deleted)"
            )
        data_dir.rename(data_dir.with_name(f"{data_dir.name}.before-restore-{int(time.time())}"))
    staging = Path(tempfile.mkdtemp(prefix="gpuslice-restore-"))
    os.chmod(staging, 0o700)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(staging, filter="data")  # no absolute paths, links out or device files
    files = manifest.get("files")
    assert isinstance(files, dict)
    for name, digest in files.items():
        if _sha256(staging / name) != digest:
            raise StateError(f"{archive}: {name} does not match its checksum: the backup is damaged")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(staging / DATA, data_dir)
    data_dir.chmod(0o700)
    return manifest, staging / HOMES


# -- upgrade ----------------------------------------------------------------------------------


def hub_db_current(db_url: str) -> bool:
    """Whether JupyterHub's database is at this JupyterHub's revision (an empty one is)."""
    from jupyterhub import orm
    from sqlalchemy import create_engine

    engine = create_engine(db_url)
    try:
        orm.check_db_revision(engine)
    except orm.DatabaseSchemaMismatch:
        return False
    finally:
        engine.dispose()
    return True


def upgrade_hub_db(db_url: str) -> None:
    """JupyterHub's own migration of its database (``jupyterhub upgrade-db``)."""
    done = subprocess.run(
        [sys.executable, "-m", "jupyterhub", "upgrade-db", f"--db={db_url}"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise StateError(f"jupyterhub upgrade-db failed: {done.stderr.strip()[-2000:]}")


@dataclass(frozen=True)
class StoreStatus:
    """One store, and whether this release must change it."""

    name: str
    where: str
    current: bool


def gpuslice_stores(data_dir: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """gpuslice's own versioned SQLite stores in ``data_dir``: name -> (file, schema steps)."""
    from spawner.class_store import SCHEMA_STEPS as CLASS_STEPS
    from spawner.incident_schema import FILE_NAME as INCIDENTS
    from spawner.incident_schema import SCHEMA_STEPS as INCIDENT_STEPS
    from spawner.ledger import SCHEMA_STEPS as LEDGER_STEPS

    return {
        "ledger": (data_dir / "ledger.sqlite", LEDGER_STEPS),
        "class store": (data_dir / "classes.sqlite", CLASS_STEPS),  # the classes that change live
        "incident store": (data_dir / INCIDENTS, INCIDENT_STEPS),  # the incident recorder's
    }


def store_statuses(data_dir: Path, market_url: str) -> list[StoreStatus]:
    """Every store the platform keeps, each said current or not for this release."""
    from market.store import Store
    from spawner.sqlite_schema import version

    hub_url = f"sqlite:///{data_dir / 'jupyterhub.sqlite'}"
    statuses = [StoreStatus("JupyterHub's database", hub_url, hub_db_current(hub_url))]
    for name, (path, steps) in gpuslice_stores(data_dir).items():
        if path.exists():
            with sqlite3.connect(path) as db:
                statuses.append(StoreStatus(name, str(path), version(db) == len(steps)))
    market = Store(market_url)
    try:
        statuses.append(StoreStatus("markets", market_url.split("@")[-1], market.at_newest()))
    finally:
        market.engine.dispose()
    return statuses


def upgrade(
    data_dir: Path, settings_file: Path | None, market_url: str, say: Callable[[str], None] = print
) -> Path | None:
    """Bring every store in ``data_dir`` to this release, after a backup into ``data_dir/backups``
    when anything will change. Returns that backup (None: everything was current)."""
    from market.store import Store
    from spawner.sqlite_schema import migrate

    data_dir = data_dir.absolute()
    stale = [s for s in store_statuses(data_dir, market_url) if not s.current]
    if not stale:
        say(f"gpuslice upgrade: every store is current for gpuslice {gpuslice_version()}")
        return None
    folder = data_dir / BACKUPS_DIR
    folder.mkdir(exist_ok=True, mode=0o700)
    saved = folder / f"before-upgrade-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
    backup(data_dir, settings_file, saved)
    say(f"gpuslice upgrade: backed up to {saved} (gpuslice restore {saved} gives it back)")
    for status in stale:
        say(f"gpuslice upgrade: migrating {status.name} ({status.where})")
    hub_url = f"sqlite:///{data_dir / 'jupyterhub.sqlite'}"
    if not hub_db_current(hub_url):
        upgrade_hub_db(hub_url)
    for name, (path, steps) in gpuslice_stores(data_dir).items():
        if path.exists():
            with sqlite3.connect(path, isolation_level=None) as db:
                migrate(db, steps, f"the {name} {path}")
    market = Store(market_url)
    try:
        market.migrate()
    finally:
        market.engine.dispose()
    return saved
