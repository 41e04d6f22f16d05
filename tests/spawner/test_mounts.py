"""Models mounted read-only: symlinks for other accounts, a read-only bind mount for root."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spawner import mounts


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "root" / "langid-97"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"weights")
    return folder


def test_links_replace_old_links_and_keep_the_users_files(tmp_path: Path, model: Path) -> None:
    models_dir = tmp_path / "home" / "models"
    mounts.prepare_links(models_dir, {"old": model})
    (models_dir / "notes.txt").parent.mkdir(exist_ok=True)
    (models_dir / "notes.txt").write_text("mine")
    mounts.prepare_links(models_dir, {"langid-97": model})
    assert sorted(p.name for p in models_dir.iterdir()) == ["langid-97", "notes.txt"]
    assert (models_dir / "langid-97" / "weights.bin").read_bytes() == b"weights"


@pytest.mark.process
def test_the_bind_mount_is_read_only_even_for_root(tmp_path: Path, model: Path) -> None:
    assert os.geteuid() == 0, "this test checks the root path (a mount namespace); run the suite as root, as CI does"
    models_dir = tmp_path / "home" / "models"
    mounts.prepare_mountpoints(models_dir, {"langid-97": model})
    probe = (
        "import sys, pathlib; d = pathlib.Path(sys.argv[1]); print(d.joinpath('weights.bin').read_bytes().decode());"
        "\ntry:\n d.joinpath('new').write_text('x'); print('WROTE')\nexcept OSError as e: print(e.strerror)"
    )
    command = mounts.bind_command(models_dir, {"langid-97": model}, [sys.executable, "-c", probe])
    result = subprocess.run([*command, str(models_dir / "langid-97")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["weights", "Read-only file system"]
    assert not (model / "new").exists()
    assert list((models_dir / "langid-97").iterdir()) == []  # the host sees only the empty mountpoint
