"""Admin accounts that nobody can claim: their passwords set from a Secret at every hub start.

FirstUseAuthenticator lets the first login under a name choose its password, which for an
admin's name means whoever logs in first becomes admin. On Kubernetes the chart keeps an
admin password in a Secret (generated once, or an existing one, ``hub.adminSecret``) and
mounts it as a file; the hub writes its bcrypt hash for every admin into the
authenticator's password store before it serves anyone, so the Secret is what counts.
"""

from __future__ import annotations

import dbm
from collections.abc import Iterable
from pathlib import Path

import bcrypt

MIN_LENGTH = 12


class AdminPasswordError(ValueError):
    """The admin password file is missing or too short; the message says what to do."""


def read_admin_password(path: Path) -> str:
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise AdminPasswordError(
            f"{path}: cannot read the admin password ({exc.strerror}); the chart mounts it from the hub's Secret "
            "(or hub.adminSecret, key 'password')"
        ) from None
    if len(password) < MIN_LENGTH:
        raise AdminPasswordError(f"{path}: the admin password must have at least {MIN_LENGTH} characters")
    return password


def set_admin_passwords(dbm_path: Path, admins: Iterable[str], password: str) -> None:
    """Store ``password``'s hash for every admin in FirstUseAuthenticator's store (its format: bcrypt)."""
    with dbm.open(str(dbm_path), "c", 0o600) as db:
        for name in admins:
            stored = db.get(name.encode("utf8"))
            if stored is None or not bcrypt.checkpw(password.encode("utf8"), stored):
                db[name.encode("utf8")] = bcrypt.hashpw(password.encode("utf8"), bcrypt.gensalt())
