"""The admins' first password and the store it goes to (hub/accounts.py), with literal inputs."""

import dbm
import os
from functools import partial
from pathlib import Path

import bcrypt
import pytest

from hub import accounts
from hub.accounts import AccountsError, admin_password, ensure_admin_passwords, has_password, passwords_path
from hub.settings import Settings


def test_generated_once_and_kept(tmp_path: Path) -> None:
    settings = Settings(admin_users=("teacher", "ta"), data_dir=tmp_path)
    first = ensure_admin_passwords(settings, tmp_path)
    assert set(first) == {"teacher", "ta"} and first["teacher"] != first["ta"]
    assert ensure_admin_passwords(settings, tmp_path) == {}  # shown once: a restart keeps them
    assert has_password(passwords_path(tmp_path), "teacher")
    assert not has_password(passwords_path(tmp_path), "stranger")


def test_from_a_private_file_or_an_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("correct-horse\n")
    secret.chmod(0o644)
    with pytest.raises(AccountsError, match=f"chmod 600 {secret}"):
        admin_password(f"file:{secret}")
    secret.chmod(0o600)
    assert admin_password(f"file:{secret}") == "correct-horse"
    with pytest.raises(AccountsError, match=r"\$GPUSLICE_TEST_PW, which is not set"):
        admin_password("env:GPUSLICE_TEST_PW")
    monkeypatch.setenv("GPUSLICE_TEST_PW", "from-the-env")
    settings = Settings(admin_users=("teacher",), admin_password_from="env:GPUSLICE_TEST_PW")
    assert ensure_admin_passwords(settings, tmp_path) == {}  # nothing to print: the admin chose it
    import dbm

    with dbm.open(str(passwords_path(tmp_path)), "r") as db:
        assert bcrypt.checkpw(b"from-the-env", db[b"teacher"])
    assert oct(os.stat(next(tmp_path.glob("passwords.dbm*"))).st_mode & 0o777) == "0o600"


def test_a_service_token_is_made_once_in_a_private_file(tmp_path: Path) -> None:
    from hub.accounts import service_token

    token = service_token(tmp_path, "portal")
    assert len(token) == 64 and service_token(tmp_path, "portal") == token
    assert (tmp_path / "portal-hub-token").stat().st_mode & 0o777 == 0o600


def test_the_charts_admin_password_is_what_counts_and_a_right_hash_is_kept(tmp_path: Path) -> None:
    store = tmp_path / "passwords.dbm"
    accounts.set_admin_passwords(store, ["root", "ops"], "from-the-secret-1")
    assert accounts.password_matches(store, "root", "from-the-secret-1")
    assert accounts.password_matches(store, "ops", "from-the-secret-1")
    with dbm.open(str(store), "r") as db:
        first_hash = db[b"root"]

    accounts.set_admin_passwords(store, ["root"], "from-the-secret-1")  # a restart with the same Secret
    with dbm.open(str(store), "r") as db:
        assert db[b"root"] == first_hash

    accounts.set_admin_passwords(store, ["root"], "rotated-secret-2")  # the Secret was changed
    assert accounts.password_matches(store, "root", "rotated-secret-2")
    assert not accounts.password_matches(store, "root", "from-the-secret-1")
    assert not accounts.password_matches(store, "nobody", "rotated-secret-2")


def test_set_password_writes_the_found_settings_store_over_the_charts_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub import settings
    from hub.cli import main

    monkeypatch.chdir(tmp_path)
    installed = partial(settings.config_path, installed=tmp_path / "etc" / "gpuslice.yaml")  # none installed
    monkeypatch.setattr(settings, "config_path", installed)
    # A stray chart variable in an admin's shell (its file is not on this machine) must not win
    # over the settings file found here: the single-machine platform's store gets the password.
    monkeypatch.setenv("GPUSLICE_KUBE_VALUES", str(tmp_path / "absent-values.yaml"))
    (tmp_path / "gpuslice.yaml").write_text(f"data_dir: {tmp_path / 'data'}\n")
    (tmp_path / "pw").write_text("correct-horse\n")
    assert main(["user", "set-password", "ben", "--password-file", str(tmp_path / "pw")]) == 0
    assert has_password(passwords_path(tmp_path / "data"), "ben")
    (tmp_path / "gpuslice.yaml").unlink()  # no settings file (as in the hub's pod): the chart's values are read
    assert main(["user", "set-password", "ben", "--password-file", str(tmp_path / "pw")]) == 2
