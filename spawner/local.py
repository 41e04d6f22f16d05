"""LocalGpuSpawner: GPU slices over JupyterHub's local process spawner.

Isolation settings (``LocalGpuSpawner.isolation``):

* ``none`` (the default when gpuslice does not run as root: a personal machine): every
  server runs as the account that runs gpuslice, with its own home folder under the data
  folder. Users cannot see each other's files through the notebook UI's file browser root, but code in a notebook
  can read and write anything that account can, other users' homes included. Use it
  when everyone trusts everyone (one person, a small team).
* ``unix-users`` (needs root; the default when gpuslice runs as root): each hub user gets
  a system account ``jupyter-<name>`` (created on first spawn) with a home of mode 0700;
  servers run as that account, never root, from the users' environment (``user_env_prefix``,
  hub/userenv.py), so users' files and processes, and the platform's, are protected from
  each other by the kernel.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Unicode, validate

from spawner import environ, mounts
from spawner.lifecycle import LedgerGpuMixin

SYSTEM_PREFIX = "jupyter-"
# Said on the spawn form under isolation none (and by `gpuslice up` as root), in these words.
SHARED_ACCOUNT_WARNING = "Everyone's notebooks on this hub run as the same account and can read each other's files."
_SAFE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,30}$")


class LocalGpuSpawner(LedgerGpuMixin, LocalProcessSpawner):  # type: ignore[misc]
    isolation = Unicode("none", help="none (one account, a home folder per user) or unix-users (needs root).").tag(
        config=True
    )
    user_env_prefix = Unicode(
        "",
        help="The Python environment servers run from when no image is chosen (empty: the hub's own). "
        "Under unix-users, one every account can read (hub/userenv.py).",
    ).tag(config=True)
    home_root = Unicode("homes", help="Folder holding each user's home folder when isolation is none.").tag(config=True)

    @validate("isolation")
    def _check_isolation(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        if value not in {"none", "unix-users"}:
            raise ValueError(f"isolation must be 'none' or 'unix-users', not {value!r}")
        if value == "unix-users" and os.geteuid() != 0:
            raise ValueError("isolation 'unix-users' creates system accounts and needs gpuslice to run as root")
        return value

    @property
    def home_dir(self) -> Path:
        if self.isolation == "unix-users":
            return Path(str(pwd.getpwnam(self.system_user).pw_dir))
        return Path(self.home_root).absolute() / str(self.user.name)

    @property
    def system_user(self) -> str:
        return SYSTEM_PREFIX + str(self.user.name).lower()

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        if self.isolation == "unix-users":
            ensure_system_user(self.system_user)
            return super().make_preexec_fn(self.system_user)  # type: ignore[no-any-return]
        home = self.home_dir
        home.mkdir(parents=True, exist_ok=True)

        def enter_home() -> None:
            os.chdir(home)

        return enter_home

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        if self.isolation == "unix-users":
            account = pwd.getpwnam(self.system_user)  # not the hub's user name: no such account
            return env | {"USER": self.system_user, "HOME": account.pw_dir, "SHELL": account.pw_shell}
        env["USER"] = self.user.name
        env["HOME"] = str(self.home_dir)
        env["SHELL"] = "/bin/bash"
        return env

    def get_args(self) -> list[str]:
        args: list[str] = super().get_args()
        # jupyter_server refuses to run as root unless told; pass it only when true.
        if self.isolation == "none" and os.geteuid() == 0:
            args.append("--allow-root")
        return args

    def platform_prefix(self) -> str:
        return self.user_env_prefix or sys.prefix

    def render_form(self) -> str:
        form: str = super().render_form()
        if self.isolation == "none":
            return f'<p class="alert alert-warning gpuslice-shared-account">{SHARED_ACCOUNT_WARNING}</p>{form}'
        return form

    def move_certs(self, paths: dict[str, str]) -> dict[str, str]:
        return paths  # internal SSL is not used on loopback

    async def start(self) -> Any:
        # The chosen image is a Python environment: run its single-user server.
        image = (self.user_options or {}).get("image") or self.gpu_default_image
        local = self.images().get(image) if isinstance(image, str) else None
        prefix = Path(local.target) if local else Path(self.platform_prefix())
        self.cmd = [str(prefix / "bin" / "jupyterhub-singleuser")]
        return await super().start()

    def prepare_home(self) -> None:
        if self.isolation == "unix-users":
            ensure_system_user(self.system_user)  # useradd --create-home
        else:
            self.home_dir.mkdir(parents=True, exist_ok=True)

    def prepare_server(self) -> None:
        """Put the chosen models at ~/models/<name>, read-only (see spawner.mounts)."""
        models = self._gpu_models or {}
        models_dir = self.home_dir / mounts.MODELS_DIRNAME
        if os.geteuid() == 0 and self.isolation == "none":
            mounts.prepare_mountpoints(models_dir, models)
            if models:
                self.cmd = mounts.bind_command(models_dir, models, list(self.cmd))
        elif models or models_dir.exists():
            mounts.prepare_links(models_dir, models)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env[environ.MODELS_DIR.name] = str(self.home_dir / mounts.MODELS_DIRNAME)
        return env


def ensure_system_user(name: str) -> None:
    """Create the system account if it does not exist (unix-users isolation)."""
    if not _SAFE_NAME.match(name):
        raise ValueError(f"{name!r} cannot be a system account name; use lower-case letters, digits, '.', '_', '-'")
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    # Private whatever the system's HOME_MODE: no other user's notebook may read it.
    Path(pwd.getpwnam(name).pw_dir).chmod(0o700)
