"""Names nobody can imitate, and logins a guesser cannot wear down.

User names are normalized the way people read them: NFKC (the full-width ``ｔｅｓｓａ`` is
``tessa``), then case-folded. What remains must be in a safe alphabet (``SAFE_NAME``:
a-z, 0-9, ``.``, ``_``, ``-``, ``@``), so a name that only looks like another one
(``tessа`` with a Cyrillic а, ``tessa`` followed by a zero-width space) is refused with
a message naming the character, instead of becoming a second account the admin page
shows as ``tessa``.

Failed logins are counted per name and per address, as jupyterhub-nativeauthenticator
counts them per name (``allowed_failed_logins``, ``seconds_before_next_try``), but in a
sliding window that lets a lockout expire by itself, and in a SQLite file beside the
passwords, so that a restarted hub (or a second hub process) keeps counting. While a
name or an address is locked, logins to it are refused before any password is checked:
the right password too, and without spending the hub's CPU on bcrypt.

The address is the last hop of ``X-Forwarded-For`` (configurable-http-proxy appends the
peer it saw) that is not a trusted proxy in front of it (loopback, where a reverse proxy on
this machine would be, and ``trusted_proxies``), or the connection's peer. Tornado's
own ``remote_ip`` is not used: it believes a client's ``X-Real-Ip``, which the proxy passes on.
"""

from __future__ import annotations

import ipaddress
import re
import sqlite3
import unicodedata
from collections.abc import Collection, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

SAFE_NAME = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}")
SAFE_WORDS = "letters a-z, digits 0-9 and . _ - @ (up to 64, starting with a letter or a digit)"


def normalize_name(typed: str) -> str:
    """A user name as the platform keeps it: NFKC, case-folded, without surrounding spaces."""
    return unicodedata.normalize("NFKC", typed).casefold().strip()


def name_problem(name: str) -> str | None:
    """Why ``name`` (normalized) cannot be a user name, in words that say what to type; None if it can."""
    if SAFE_NAME.fullmatch(name):
        return None
    shown = ascii(name)  # invisible and look-alike characters as \u escapes: the reader sees them
    odd = list(dict.fromkeys(c for c in name if not (c.isascii() and (c.isalnum() or c in "._@-"))))
    if odd:
        described = ", ".join(_describe(c) for c in odd[:3]) + (" and more" if len(odd) > 3 else "")
        return f"The user name {shown} has {described}: type it with {SAFE_WORDS} only."
    if not name:
        return f"Type a user name: {SAFE_WORDS}."
    if len(name) > 64:
        return f"The user name {shown[:40]}... is {len(name)} characters long; user names have {SAFE_WORDS}."
    return f"The user name {shown} must start with a letter or a digit; user names have {SAFE_WORDS}."


def _describe(char: str) -> str:
    what = f"U+{ord(char):04X} {unicodedata.name(char, '')}".strip()
    if char == " ":
        return "a space"
    if not char.isprintable() or unicodedata.category(char) in ("Cf", "Zs"):
        return f"an invisible character ({what})"
    return f"{char!r} ({what})"


# Proxies on this machine: configurable-http-proxy listens on loopback only, so a loopback hop is
# a reverse proxy in front of it (nginx, traefik) or a local process, which could reach the hub's
# own port and write any X-Forwarded-For anyway: trusting it costs nothing and finds the client.
LOOPBACK = ("127.0.0.0/8", "::1/128")


def client_address(forwarded_for: str | None, peer: str, trusted: Collection[str] = LOOPBACK) -> str:
    """The client's address: the last ``X-Forwarded-For`` hop that is not a ``trusted`` proxy (addresses
    or networks; the proxy appends the peer it saw, so the hops a client wrote come before it), else the peer."""
    networks = [ipaddress.ip_network(t, strict=False) for t in trusted]
    hops = [hop.strip() for hop in (forwarded_for or "").split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _within(hop, networks):
            return hop
    return peer


def _within(hop: str, networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        address = ipaddress.ip_address(hop)
    except ValueError:
        return False  # not an address: whatever a client wrote, counted as written
    return any(address in network for network in networks)


@dataclass(frozen=True)
class Limit:
    """``failures`` failed logins within ``window_s`` seconds lock; 0 failures: no limit."""

    failures: int
    window_s: float


def locked_for(failed_at: Sequence[float], limit: Limit, now: float) -> float:
    """Seconds left of a lockout (0: not locked), from the times of the failures.

    Locked while ``limit.failures`` of them fall within the last ``window_s``: the lock ends
    when the oldest of those ages out of the window. Logins refused while locked are not
    failures (they are never checked), so a lockout always ends.
    """
    if limit.failures <= 0:
        return 0.0
    recent = sorted(t for t in failed_at if now - t < limit.window_s)
    if len(recent) < limit.failures:
        return 0.0
    return max(0.0, recent[-limit.failures] + limit.window_s - now)


def _minutes(seconds: float) -> str:
    return f"{int(seconds) + 1} s" if seconds < 90 else f"{round(seconds / 60)} min"


SCHEMA = """
CREATE TABLE IF NOT EXISTS failed_login (
    kind TEXT NOT NULL,  -- "name" or "address"
    who TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS failed_login_who ON failed_login (kind, who, at);
"""


class LoginThrottle:
    """Failed logins per name and per address, kept in SQLite (``DATA/logins.sqlite``)."""

    def __init__(self, path: Path, per_name: Limit, per_address: Limit) -> None:
        self.path, self.per_name, self.per_address = path, per_name, per_address

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.executescript(SCHEMA)
        return db

    def _times(self, db: sqlite3.Connection, kind: str, who: str, since: float) -> list[float]:
        rows = db.execute("SELECT at FROM failed_login WHERE kind = ? AND who = ? AND at > ?", (kind, who, since))
        return [float(at) for (at,) in rows]

    def refusal(self, name: str, address: str, now: float) -> str | None:
        """Why a login to ``name`` from ``address`` is refused now without looking at the password; None: go on."""
        with closing(self._connect()) as db:
            by_name = locked_for(self._times(db, "name", name, now - self.per_name.window_s), self.per_name, now)
            by_address = locked_for(
                self._times(db, "address", address, now - self.per_address.window_s), self.per_address, now
            )
        if by_name:
            return (
                f"Too many failed logins for {name}: try again in {_minutes(by_name)}, "
                "or ask an admin to reset the password (`gpuslice user set-password`), which also lifts this."
            )
        if by_address:
            return f"Too many failed logins from your address: try again in {_minutes(by_address)}."
        return None

    def failed(self, name: str, address: str, now: float) -> None:
        """Count a failed login (and forget failures older than both windows)."""
        oldest = now - max(self.per_name.window_s, self.per_address.window_s)
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM failed_login WHERE at < ?", (oldest,))
            db.executemany(
                "INSERT INTO failed_login (kind, who, at) VALUES (?, ?, ?)",
                [("name", name, now), ("address", address, now)],
            )

    def forget(self, name: str) -> None:
        forget_failures(self.path, name)


def forget_failures(path: Path, name: str) -> None:
    """The name's failures are forgotten (it logged in, or an admin set its password). Its addresses'
    are kept: logging in to one's own account does not lift an address's lock."""
    if not path.exists():
        return
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.executescript(SCHEMA)
        db.execute("DELETE FROM failed_login WHERE kind = 'name' AND who = ?", (name,))


def logins_path(data_dir: Path) -> Path:
    return data_dir.absolute() / "logins.sqlite"
