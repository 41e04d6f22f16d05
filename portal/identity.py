"""The identity the auth gate hands to Streamlit, signed so nobody else can forge it.

Streamlit listens on loopback where any local user could reach it and send any header.
The gate signs the logged-in user (name, admin, groups, expiry) with a secret that only
the gate and Streamlit hold (HMAC-SHA256); every page verifies it before showing data.
It also carries the user's own OAuth token for the hub: what the portal does on a
user's behalf (starting their server, an admin stopping one) uses that user's authority,
never the portal service's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field

HEADER = "X-Gpuslice-Identity"
LIFETIME_S = 8 * 3600  # a browser tab's websocket carries the identity it opened with


class IdentityError(ValueError):
    """No identity, a forged one, or an expired one."""


@dataclass(frozen=True)
class Identity:
    name: str
    admin: bool = False
    groups: tuple[str, ...] = ()
    hub_token: str = field(default="", repr=False, compare=False)  # the user's own OAuth token


def sign(identity: Identity, secret: bytes, now: float | None = None) -> str:
    payload = {
        "name": identity.name,
        "admin": identity.admin,
        "groups": list(identity.groups),
        "hub_token": identity.hub_token,
        "exp": int((time.time() if now is None else now) + LIFETIME_S),
    }
    body = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
    return f"{body}.{_mac(body, secret)}"


def verify(value: str | None, secret: bytes, now: float | None = None) -> Identity:
    if not value:
        raise IdentityError("not logged in: open the portal through JupyterHub")
    body, _, mac = value.rpartition(".")
    if not body or not hmac.compare_digest(mac, _mac(body, secret)):
        raise IdentityError("the identity was not signed by the portal's gate")
    try:
        payload = json.loads(base64.urlsafe_b64decode(body.encode()))
    except ValueError as exc:
        raise IdentityError("the identity is malformed") from exc
    if payload.get("exp", 0) < (time.time() if now is None else now):
        raise IdentityError("the login has expired: reload the page")
    return Identity(
        str(payload["name"]),
        bool(payload.get("admin")),
        tuple(payload.get("groups") or ()),
        str(payload.get("hub_token") or ""),
    )


def _mac(body: str, secret: bytes) -> str:
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
