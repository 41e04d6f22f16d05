"""The users' Python environment: where notebook servers run from under ``isolation: unix-users``.

The platform's own environment may live where no other account can enter (a virtual
environment under /root, mode 0700), and it holds the hub's code, which notebooks have no
business importing. So, as The Littlest JupyterHub keeps /opt/tljh/user apart from the
hub's /opt/tljh/hub, ``gpuslice up`` as root keeps a second environment, readable by every
account and writable by root only: a virtual environment made from the system's python3
with jupyterlab and jupyterhub-singleuser at the versions the hub itself runs (the
single-user server speaks the hub's API), and the kernel hook in ``share/gpuslice/kernel_hook``.

It is built once and reused while its stamp (those versions and the hook's files) matches;
a changed hub or hook rebuilds or refreshes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

from spawner.assets import HOOK_DIR, LAB_DIR

# What the single-user server needs, pinned to what the hub's environment has installed.
PACKAGES = ("jupyterhub", "jupyterlab", "ipykernel")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
STAMP = "gpuslice-user-env.json"
HOOK_SUBDIR = Path("share") / "gpuslice" / "kernel_hook"
LAB_SUBDIR = Path("share") / "gpuslice" / "lab"  # JupyterLab's reclaim notice (JUPYTER_PATH)


class UserEnvError(RuntimeError):
    """The users' environment cannot be built; the message says what to do."""


def hook_dir(prefix: Path) -> Path:
    return prefix / HOOK_SUBDIR


def lab_dir(prefix: Path) -> Path:
    return prefix / LAB_SUBDIR


def wanted_stamp() -> dict[str, str]:
    """The versions the environment must have, and a digest of the kernel hook's and the lab notice's files."""
    digest = hashlib.sha256()
    for path in sorted(HOOK_DIR.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    lab = hashlib.sha256()
    for path in sorted(p for p in LAB_DIR.rglob("*") if p.is_file()):
        lab.update(str(path.relative_to(LAB_DIR)).encode() + b"\0" + path.read_bytes())
    return {
        **{name: version(name) for name in PACKAGES},
        "kernel_hook": digest.hexdigest(),
        "lab_notice": lab.hexdigest(),
    }


def current_stamp(prefix: Path) -> dict[str, str]:
    try:
        stamp = json.loads((prefix / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def system_python() -> Path:
    for candidate in SYSTEM_PYTHONS:
        if Path(candidate).exists():
            return Path(candidate)
    raise UserEnvError(
        "isolation unix-users runs notebooks from a Python every account can read, made from the "
        f"system's python3, and none was found at {' or '.join(SYSTEM_PYTHONS)}: apt-get install python3 python3-venv"
    )


def ensure(prefix: Path) -> bool:
    """Build or refresh the environment at ``prefix``; True when anything was (re)built.

    Two platforms starting at once (tests in parallel) take turns: one builds, the other reuses."""
    prefix.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(prefix)


def _ensure(prefix: Path) -> bool:
    wanted, have = wanted_stamp(), current_stamp(prefix)
    if have == wanted and (prefix / "bin" / "jupyterhub-singleuser").exists():
        return False
    packages_match = all(have.get(name) == wanted[name] for name in PACKAGES)
    if not packages_match or not (prefix / "bin" / "jupyterhub-singleuser").exists():
        _install(prefix, wanted)
    _copy_hook(prefix)
    _copy_lab(prefix)
    _write_public(prefix / STAMP, json.dumps(wanted, indent=1))
    return True


def _install(prefix: Path, wanted: dict[str, str]) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if prefix.exists():
        shutil.rmtree(prefix)  # versions changed: start clean rather than leave old packages behind
    steps = [
        [str(system_python()), "-m", "venv", str(prefix)],
        [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", *(f"{n}=={wanted[n]}" for n in PACKAGES)],
    ]
    for step in steps:
        # umask 022: every account must read and run what root installs here, and none may change it.
        done = subprocess.run(step, capture_output=True, text=True, umask=0o022)
        if done.returncode != 0:
            raise UserEnvError(
                f"could not build the users' Python environment in {prefix} ({' '.join(step[:4])}...):\n"
                f"{done.stderr.strip()[-2000:]}\nFix the cause (for example apt-get install python3-venv) "
                "and run gpuslice up again."
            )
    prefix.chmod(0o755)


def _copy_hook(prefix: Path) -> None:
    target = hook_dir(prefix)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True, mode=0o755)
    for path in HOOK_DIR.glob("*.py"):
        _write_public(target / path.name, path.read_text())
    for folder in (target, target.parent, target.parent.parent):
        folder.chmod(0o755)


def _copy_lab(prefix: Path) -> None:
    target = lab_dir(prefix)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(LAB_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))  # sources only
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _write_public(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o644)
