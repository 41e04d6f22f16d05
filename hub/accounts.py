"""Accounts nobody can steal: admins and class members get their first password from us.

JupyterHub's FirstUseAuthenticator lets the first person to type a new name set its
password. That is fine for open sign-up of new names, and wrong for the names this
platform already knows: an admin or a roster member who has not logged in yet would
belong to whichever stranger typed the name first. So:

* admins get a password at the first ``gpuslice up`` (printed once, or read from the
  file or environment variable that ``admin_password_from`` names);
* ``gpuslice class add`` gives each new member a single-use invite code, printed once or
  written to a 0600 file: at ``/hub/join`` the member types their name, the code and the
  password they choose; the code then stops working (``redeem_invite``). A code is never a
  password: it does not log anyone in, and it is kept (bcrypt) in ``DATA/invites.dbm``;
* ``gpuslice user set-password NAME`` sets or resets one;
* ``GpusliceAuthenticator`` (hub/authenticator.py) refuses a login to a known name that has no password yet,
  instead of letting the login set it. Known names are the admins, every class's members
  and teachers, and any name with an invite code waiting.

Names are normalized and held to a safe alphabet, and failed logins are throttled per name
and per address (hub/logins.py).

Passwords are bcrypt hashes in ``DATA/passwords.dbm``, the format FirstUseAuthenticator reads.

On Kubernetes the chart keeps the admins' password in a Secret (generated once, or
``hub.adminSecret``) mounted as a file; the hub writes its hash for every admin into the
store at every start (``set_admin_passwords``), so the Secret is what counts. The chart's
class members are known names too; an admin gives them invite codes (or passwords) from
inside the hub's pod: ``kubectl exec deploy/RELEASE-gpuslice-hub -- gpuslice user invite``
(the CLI reads the chart's values from ``environ.KUBE_VALUES``, as the hub does).
"""

from __future__ import annotations

import dbm
import os
import secrets
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import bcrypt

from hub.logins import LOOPBACK, client_address, normalize_name
from hub.settings import Settings
from spawner import environ
from spawner.quotas import GroupRules

MIN_PASSWORD_LENGTH = 7  # FirstUseAuthenticator's own minimum


# The same words for a wrong code, another member's code and a spent one: nothing to probe.
INVITE_REFUSED = (
    "That invite code does not open this name: check both, or ask your teacher for a new code "
    "(a code works once; after that, log in with the password you chose)."
)


class AccountsError(ValueError):
    """A password or its source that cannot be used; the message says what to do."""


def passwords_path(data_dir: Path) -> Path:
    return data_dir.absolute() / "passwords.dbm"


def known_names(settings: Settings) -> set[str]:
    """Admins and every class's members and teachers: names whose first password must come from us."""
    return roster_names(settings.admin_users, settings.groups)


def roster_names(admins: Iterable[str], groups: Iterable[GroupRules]) -> set[str]:
    """``admins`` and every member and teacher of ``groups`` (from gpuslice.yaml or the chart), normalized as
    logins are (hub/logins.py)."""
    people = {name for group in groups for name in (*group.members, *group.teachers)}
    return {normalize_name(name) for name in people | set(admins)}


def has_password(store: Path, name: str) -> bool:
    try:
        with dbm.open(str(store), "r") as db:
            return db.get(name.encode()) is not None
    except dbm.error:  # no password store yet: nobody has a password
        return False


def password_matches(store: Path, name: str, password: str) -> bool:
    try:
        with dbm.open(str(store), "r") as db:
            stored = db.get(name.encode())
    except dbm.error:  # no password store yet
        return False
    return stored is not None and bcrypt.checkpw(password.encode(), stored)


def set_password(store: Path, name: str, password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountsError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with dbm.open(str(store), "c", 0o600) as db:
        db[name.encode()] = bcrypt.hashpw(password.encode(), bcrypt.gensalt())


def new_code() -> str:
    """A password nobody can guess, short enough to read out: 16 URL-safe characters (96 bits)."""
    return secrets.token_urlsafe(12)


def first_passwords(store: Path, names: Iterable[str]) -> dict[str, str]:
    """A new password for each name without one (the admins' at the first start): name -> password."""
    given = {}
    for name in names:
        if not has_password(store, name):
            given[name] = new_code()
            set_password(store, name, given[name])
    return given


def service_token_file(data_dir: Path, service: str) -> Path:
    """A hub service's API token, made once into ``DATA/SERVICE-hub-token`` (0600), for whoever reads it from a file."""
    path = data_dir / f"{service}-hub-token"
    if not path.exists():
        write_private(path, secrets.token_hex(32))
    return path


def service_token(data_dir: Path, service: str) -> str:
    return service_token_file(data_dir, service).read_text().strip()


def invites_path(data_dir: Path) -> Path:
    return data_dir.absolute() / "invites.dbm"


def invite_codes(data_dir: Path, names: Iterable[str], renew: bool = False) -> dict[str, str]:
    """A single-use invite code for each name with neither a password nor a code waiting: name -> code.

    ``renew``: a code still waiting is replaced (the member lost it); the old one stops working."""
    passwords, invites = passwords_path(data_dir), invites_path(data_dir)
    given = {}
    for name in names:
        if not has_password(passwords, name) and (renew or not has_password(invites, name)):
            given[name] = new_code()
            set_password(invites, name, given[name])
    return given


def redeem_invite(data_dir: Path, name: str, code: str, password: str) -> None:
    """``name`` chooses ``password`` with their invite code, which is then gone; AccountsError otherwise."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountsError(f"choose a password of at least {MIN_PASSWORD_LENGTH} characters")
    invites = invites_path(data_dir)
    if not has_password(invites, name):  # no code waiting (or no store at all)
        raise AccountsError(INVITE_REFUSED)
    with dbm.open(str(invites), "w") as db:  # one writer at a time: a code is spent once
        hashed = db.get(name.encode())
        if hashed is None or not bcrypt.checkpw(code.encode(), hashed):
            raise AccountsError(INVITE_REFUSED)
        set_password(passwords_path(data_dir), name, password)
        del db[name.encode()]


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (created 0600, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)
        out.write(text)


def admin_password(source: str) -> str | None:
    """The admins' first password from ``admin_password_from`` ("file:PATH", "env:NAME"); None: generate."""
    if not source:
        return None
    kind, _, where = source.partition(":")
    if kind == "env":
        value = environ.named(where)
        if not value:
            raise AccountsError(f"admin_password_from names ${where}, which is not set; export it or use file:PATH")
        return value
    if kind == "file":
        path = Path(where)
        try:
            if path.stat().st_mode & 0o077:
                raise AccountsError(f"{path} can be read by other accounts; chmod 600 {path}")
            return path.read_text().strip()
        except OSError as exc:
            raise AccountsError(f"admin_password_from: cannot read {path} ({exc.strerror})") from None
    raise AccountsError(f'admin_password_from must be "file:PATH" or "env:NAME", not {source!r}')


def admins_without_password(settings: Settings, data_dir: Path) -> list[str]:
    store = passwords_path(data_dir)
    return [a.lower() for a in settings.admin_users if not has_password(store, a.lower())]


def ensure_admin_passwords(settings: Settings, data_dir: Path) -> dict[str, str]:
    """Give every admin without a password one; returns the generated ones (to print once)."""
    store = passwords_path(data_dir)
    missing = admins_without_password(settings, data_dir)
    chosen = admin_password(settings.admin_password_from) if missing else None
    if chosen is None:
        return first_passwords(store, missing)
    for name in missing:
        set_password(store, name, chosen)
    return {}


def signup_words(settings: Settings) -> str:
    """What the login page accepts, in the words the startup banner prints."""
    known = (
        "admins log in with the password gpuslice gave them; class members and teachers join once at /hub/join "
        "with their code"
    )
    return f"{known}; {settings.signup_words()}"


def request_address(request: Any, trusted: Collection[str] = LOOPBACK) -> str:
    """The client's address for throttling (hub/logins.py ``client_address``), from a tornado request."""
    address = getattr(getattr(request.connection, "context", None), "address", None)
    peer = address[0] if isinstance(address, tuple) and address else request.remote_ip
    return client_address(request.headers.get("X-Forwarded-For"), str(peer), trusted)


# -- Kubernetes: the admins' password from the chart's Secret --------------------------------

ADMIN_SECRET_MIN_LENGTH = 12  # the chart's admin Secret (Kubernetes)


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
    if len(password) < ADMIN_SECRET_MIN_LENGTH:
        raise AdminPasswordError(f"{path}: the admin password must have at least {ADMIN_SECRET_MIN_LENGTH} characters")
    return password


def set_admin_passwords(dbm_path: Path, admins: Iterable[str], password: str) -> None:
    """Make ``password`` every admin's (the chart's Secret is what counts); a hash already right is kept."""
    for name in admins:
        if not password_matches(dbm_path, name, password):
            set_password(dbm_path, name, password)
