import os
import pwd
import subprocess

import pytest

from spawner.local import LocalGpuSpawner, ensure_system_user


def test_isolation_must_be_known() -> None:
    with pytest.raises(Exception, match="isolation must be 'none' or 'unix-users'"):
        LocalGpuSpawner(isolation="docker")


@pytest.mark.process
def test_unix_users_needs_root_and_creates_the_account() -> None:
    if os.geteuid() != 0:
        with pytest.raises(Exception, match="needs gpuslice to run as root"):
            LocalGpuSpawner(isolation="unix-users")
        return
    name = f"jupyter-gstest{os.getpid()}"
    try:
        ensure_system_user(name)
        ensure_system_user(name)  # idempotent
        account = pwd.getpwnam(name)
        assert account.pw_uid != 0 and os.path.isdir(account.pw_dir)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.mark.parametrize("name", ["Root", "../etc", "a b", "jupyter-" + "x" * 40, "-rf"])
def test_unsafe_account_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot be a system account name"):
        ensure_system_user(name)
