"""The users' Python environment (hub/userenv.py): reused while it matches, refreshed when the hook changes."""

import json
import os
import stat
from pathlib import Path

import pytest

from hub import userenv


def test_a_matching_environment_is_reused_and_a_changed_hook_refreshed(tmp_path: Path) -> None:
    prefix = tmp_path / "user"
    singleuser = prefix / "bin" / "jupyterhub-singleuser"
    singleuser.parent.mkdir(parents=True)
    singleuser.write_text("#!/bin/sh\n")  # stands for an environment built earlier at these versions
    wanted = userenv.wanted_stamp()
    (prefix / userenv.STAMP).write_text(json.dumps({**wanted, "kernel_hook": "an older hook"}))
    assert userenv.ensure(prefix) is True  # the hook is copied again; the packages match: no pip
    assert userenv.current_stamp(prefix) == wanted
    hook = userenv.hook_dir(prefix)
    assert sorted(p.name for p in hook.iterdir()) == ["gpuslice_limits.py", "gpuslice_notebook.py", "sitecustomize.py"]
    for path in [hook, *hook.iterdir()]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o044 == 0o044 and mode & 0o022 == 0, f"{path}: {oct(mode)}"  # all read, only root writes
    assert userenv.ensure(prefix) is False


def test_the_lab_notice_is_copied_where_every_account_can_read_it_and_refreshed_when_it_changes(
    tmp_path: Path,
) -> None:
    prefix = tmp_path / "user"
    singleuser = prefix / "bin" / "jupyterhub-singleuser"
    singleuser.parent.mkdir(parents=True)
    singleuser.write_text("#!/bin/sh\n")
    wanted = userenv.wanted_stamp()
    (prefix / userenv.STAMP).write_text(json.dumps({**wanted, "lab_notice": "an older notice"}))
    assert userenv.ensure(prefix) is True
    extension = userenv.lab_dir(prefix) / "labextensions" / "@gpuslice" / "reclaim-notice"
    assert json.loads((extension / "package.json").read_text())["jupyterlab"]["_build"]["load"] == (
        "static/remoteEntry.js"
    )
    for path in [userenv.lab_dir(prefix), *userenv.lab_dir(prefix).rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o044 == 0o044 and mode & 0o022 == 0, f"{path}: {oct(mode)}"


def test_the_environment_is_made_from_a_python_every_account_can_run() -> None:
    python = userenv.system_python()
    assert not str(python).startswith("/root")
    assert os.stat(python).st_mode & 0o005 == 0o005


def test_no_system_python_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(userenv, "SYSTEM_PYTHONS", ("/nonexistent/python3",))
    with pytest.raises(userenv.UserEnvError, match="apt-get install python3 python3-venv"):
        userenv.system_python()
