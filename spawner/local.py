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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Dict, Unicode, validate

from spawner import environ, mounts
from spawner.cgroups import Limits, limits_for
from spawner.confinement import Confinement, Server, for_machine, nvidia_nodes, platform_id, unit_name
from spawner.job_request import JobPlace
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
    gpu_confine = Bool(
        True, help="As root, each server in a cgroup or systemd scope of its own, with its limits (gpu_limits)."
    ).tag(config=True)
    gpu_limits = Dict(
        help="The settings' limits (memory, processes, cpu_weight, tmp, shm); a class's own limits go over them."
    ).tag(config=True)
    gpu_device_dir = Unicode(
        "/dev", help="Where the GPUs' device nodes are, for each server's device rules (a test's mknod folder)."
    ).tag(config=True)

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
        if self.isolation == "unix-users" and not self._gpu_unit:
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
        """Confine the server (as root); put the chosen models at ~/models/<name>, read-only (see spawner.mounts)."""
        models = self._gpu_models or {}
        models_dir = self.home_dir / mounts.MODELS_DIRNAME
        confinement = self._confinement()
        if confinement is not None:
            mounts.prepare_mountpoints(models_dir, models)
            self._gpu_unit = unit_name(platform_id(self._data_dir), self._key, time.time())
            server = Server(
                self._gpu_unit,
                self.server_limits(),
                {h.gpu_index for h in self._gpu_holds or []},
                user=self.system_user if self.isolation == "unix-users" else "",
                keep=self._paths_to_keep(),
                models={str(models_dir / name): str(source) for name, source in models.items()},
            )
            self.cmd = confinement.command(server, nvidia_nodes(Path(self.gpu_device_dir)), list(self.cmd))
        elif os.geteuid() == 0 and self.isolation == "none":
            mounts.prepare_mountpoints(models_dir, models)
            if models:
                self.cmd = mounts.bind_command(models_dir, models, list(self.cmd))
        elif models or models_dir.exists():
            mounts.prepare_links(models_dir, models)

    def job_place(self, image: str, group: str | None) -> JobPlace:
        """Where this user's jobs run: the image's environment, their home (made now), their account; the memory
        their class's servers may have, where servers are held to it (as root)."""
        local = self.images()[image]
        self.prepare_home()
        account = self.system_user if self.isolation == "unix-users" else ""
        confined = self.gpu_confine and os.geteuid() == 0
        memory = limits_for(self.gpu_limits, [group] if group else []).memory_bytes if confined else None
        return JobPlace(local.target, self.home_dir, account, memory)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env[environ.MODELS_DIR.name] = str(self.home_dir / mounts.MODELS_DIRNAME)
        return env

    # -- confinement ---------------------------------------------------------------------

    @property
    def _data_dir(self) -> Path:
        return Path(self.gpu_ledger_path).absolute().parent

    def _confinement(self) -> Confinement | None:
        return machine_confinement(self._data_dir) if self.gpu_confine else None

    def server_limits(self) -> Limits:
        """The settings' limits, or those of the user's class (the one charged for the slice first)."""
        mine = {g.name for g in self.user.groups}
        classes = [g.name for g in self.gpu_group_rules if g.name in mine]
        charged = [h.group for h in self._gpu_holds or [] if h.group in classes]
        return limits_for(self.gpu_limits, [*charged, *classes])

    def _paths_to_keep(self) -> list[str]:
        """What the server needs from the machine's /tmp once its own is mounted there: its home,
        the environment it runs from, the kernel hook, the device nodes (in tests all may be under /tmp)."""
        paths = [self.home_dir, Path(self.cmd[0]).parent.parent, Path(self.gpu_kernel_hook_dir), Path(self.gpu_lab_dir)]
        paths.append(Path(self.gpu_device_dir))
        return sorted({str(p.absolute()) for p in paths if p.absolute().is_relative_to("/tmp")})

    def clear_state(self) -> None:
        unit = self._gpu_unit
        super().clear_state()
        self._gpu_unit = ""
        confinement = self._confinement()
        if unit and confinement is not None:
            left = confinement.remove(unit)  # the kernels and anything else the server left
            if left:
                self.log.info("gpuslice: %s: ended %d process(es) left in %s", self._key, len(left), unit)


_CONFINEMENTS: dict[Path, Confinement | None] = {}


def machine_confinement(data_dir: Path) -> Confinement | None:
    """The machine's way of confining servers, found once per hub process (`gpuslice up` says which)."""
    if data_dir not in _CONFINEMENTS:
        _CONFINEMENTS[data_dir] = for_machine(data_dir)
    return _CONFINEMENTS[data_dir]


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
