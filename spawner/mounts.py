"""Models mounted read-only into a local notebook server, at ``$HOME/models/<name>``.

Two ways, chosen by who the server runs as:

* the server runs as root (the hub runs as root with isolation ``none``): the server
  starts in its own mount namespace (``unshare --mount``) where each model folder is
  bind-mounted read-only, so even root in the notebook cannot write it;
* otherwise: a symlink per model to the read-only model folder (files 0444, folders
  0555, owned by the hub's account). With isolation ``unix-users`` the notebook's
  account cannot write them; with ``none`` they share an account with the hub, so the
  modes stop accidents, not intent (docs/markets.md says so).

Run as ``python -m spawner.mounts MODELS_DIR NAME=SOURCE... -- COMMAND...`` inside the
new namespace: it makes the bind mounts, then execs COMMAND.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MODELS_DIRNAME = "models"


def prepare_links(models_dir: Path, models: dict[str, Path]) -> None:
    """Replace the symlinks in ``models_dir`` with one per model (other files are left alone)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    _clear(models_dir)
    for name, source in models.items():
        (models_dir / name).symlink_to(source, target_is_directory=True)


def prepare_mountpoints(models_dir: Path, models: dict[str, Path]) -> None:
    models_dir.mkdir(parents=True, exist_ok=True)
    _clear(models_dir)
    for name in models:
        (models_dir / name).mkdir(exist_ok=True)


def add_links(models_dir: Path, models: dict[str, Path]) -> None:
    """A symlink per model in ``models_dir``, leaving the others (a job beside a running server)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    for name, source in models.items():
        link = models_dir / name
        if link.is_symlink() and link.readlink() != source:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(source, target_is_directory=True)


def add_mountpoints(models_dir: Path, models: dict[str, Path]) -> None:
    """An empty folder per model to bind it on, leaving the others: a job beside a running server must not
    take away the server's mountpoints (each binds its models in its own mount namespace)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    for name in models:
        target = models_dir / name
        if target.is_symlink():
            target.unlink()
        target.mkdir(exist_ok=True)


def bind_command(models_dir: Path, models: dict[str, Path], command: list[str]) -> list[str]:
    """``command`` wrapped to run in a private mount namespace with the models bound read-only."""
    unshare = shutil.which("unshare") or "unshare"
    specs = [f"{name}={source}" for name, source in models.items()]
    return [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "--",
        sys.executable,
        # By path, not "-m spawner.mounts": the server's Python path holds only the kernel
        # hook, which hides the platform's packages; this file needs nothing but the stdlib.
        str(Path(__file__).absolute()),
        str(models_dir),
        *specs,
        "--",
        *command,
    ]


def _clear(models_dir: Path) -> None:
    for entry in models_dir.iterdir():
        if entry.is_symlink():
            entry.unlink()
        elif entry.is_dir() and not any(entry.iterdir()):
            entry.rmdir()  # an old mountpoint


def _bind_read_only(source: str, target: Path) -> None:
    subprocess.run(["mount", "--bind", source, str(target)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    models_dir, specs, command = Path(argv[0]), argv[1:split], argv[split + 1 :]
    for spec in specs:
        name, source = spec.split("=", 1)
        _bind_read_only(source, models_dir / name)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
