"""The hub's authenticator: FirstUseAuthenticator, except that the names this platform knows cannot
be claimed by whoever types them first (the reasons and the password and invite stores are in
hub/accounts.py). Apart from those stores so that the commands that only read or write them
(`gpuslice up`, `gpuslice class`, `gpuslice user`) do not import JupyterHub."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

from firstuseauthenticator import FirstUseAuthenticator
from traitlets import Bool, Integer, List, Set, TraitError, Unicode, validate

from hub.accounts import has_password, invites_path, request_address
from hub.logins import LOOPBACK, Limit, LoginThrottle, logins_path, name_problem, normalize_name

NO_PASSWORD_YET = (
    "This account has no password yet, and it cannot be claimed by typing one: "
    "ask your teacher for your invite code, or an admin to run `gpuslice user set-password {name}`."
)

USE_THE_INVITE = "Your account is waiting for you: choose your password with your invite code at {url}."


class GpusliceAuthenticator(FirstUseAuthenticator):  # type: ignore[misc]
    """FirstUseAuthenticator, except that a known name without a password cannot be claimed (a
    class member or teacher chooses theirs at /hub/join with their single-use invite code), names
    are normalized and held to a safe alphabet, and failed logins are throttled (hub/logins.py)."""

    known_names = Set(
        Unicode(), help="Admins, class members and teachers: their first password comes from gpuslice."
    ).tag(config=True)
    data_dir = Unicode(
        "", help="The data folder: invite codes in invites.dbm (hub/accounts.py), failed logins in logins.sqlite."
    ).tag(config=True)
    safe_usernames = Bool(
        True, help="Refuse user names outside a-z, 0-9, '.', '_', '-', '@' (after NFKC and case folding)."
    ).tag(config=True)
    # The names of jupyterhub-nativeauthenticator's options, counted in a sliding window.
    allowed_failed_logins = Integer(
        10, help="Failed logins to one name within seconds_before_next_try that lock it (0: never locked)."
    ).tag(config=True)
    seconds_before_next_try = Integer(300, help="The window of allowed_failed_logins, in seconds.").tag(config=True)
    allowed_failed_logins_per_address = Integer(
        20, help="Failed logins from one address within seconds_before_next_try_per_address that lock it (0: never)."
    ).tag(config=True)
    seconds_before_next_try_per_address = Integer(60, help="The window of the address's failed logins.").tag(
        config=True
    )
    trusted_proxies = List(
        Unicode(),
        list(LOOPBACK),
        help="Addresses or networks of proxies in front of configurable-http-proxy (a reverse proxy on this "
        "machine, a load balancer, an ingress): their X-Forwarded-For hops are skipped to find the client's address.",
    ).tag(config=True)

    @validate("trusted_proxies")
    def _networks(self, proposal: Any) -> list[str]:
        for entry in proposal["value"]:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise TraitError(f"trusted_proxies: {entry!r} is not an address or a network (10.0.0.0/8)") from None
        return list(proposal["value"])

    def normalize_username(self, username: str) -> str:
        normalized: str = super().normalize_username(normalize_name(username))
        return normalized

    def validate_username(self, name: str) -> bool:
        valid: bool = super().validate_username(name)
        return valid and not (self.safe_usernames and name_problem(name))

    def throttle(self) -> LoginThrottle:
        folder = Path(self.data_dir) if self.data_dir else Path(self.dbm_path).parent
        return LoginThrottle(
            logins_path(folder),
            Limit(self.allowed_failed_logins, self.seconds_before_next_try),
            Limit(self.allowed_failed_logins_per_address, self.seconds_before_next_try_per_address),
        )

    def unsafe_name(self, name: str) -> str | None:
        """Why ``name`` (normalized) is refused, naming the character, when it is outside the safe alphabet."""
        problem = name_problem(name) if self.safe_usernames else None
        if problem:
            self.log.warning("refused the user name %s", ascii(name)[:80])
        return problem

    def lockout(self, name: str, address: str) -> str | None:
        """Why a login is refused while the name or the address is locked out (checked before any password)."""
        refusal = self.throttle().refusal(name, address, time.time())
        if refusal:
            self.log.warning("refused a login to %s from %s: locked out after failed logins", name, address)
        return refusal

    def invited(self, name: str) -> bool:
        return bool(self.data_dir) and has_password(invites_path(Path(self.data_dir)), name)

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        """The name, or None with the reason in ``handler.custom_login_error`` (FirstUseAuthenticator's login
        page shows it)."""
        name = self.normalize_username(data["username"])
        address = request_address(handler.request, self.trusted_proxies)
        refusal = self.unsafe_name(name) or self.lockout(name, address)
        if refusal:
            handler.custom_login_error = refusal
            return None
        throttle = self.throttle()
        if (name in self.known_names or self.invited(name)) and not has_password(Path(self.dbm_path), name):
            throttle.failed(name, address, time.time())
            self.log.warning("refused a first login to %s, which has no password yet", name)
            if self.invited(name):
                handler.custom_login_error = USE_THE_INVITE.format(url=handler.hub.base_url + "join")
            else:
                handler.custom_login_error = NO_PASSWORD_YET.format(name=name)
            return None
        result: str | None = await super().authenticate(handler, data)
        if result is None:
            throttle.failed(name, address, time.time())
        else:
            throttle.forget(name)
        return result

    def get_handlers(self, app: Any) -> list[tuple[str, Any]]:
        from hub.join import JoinHandler  # JupyterHub's handlers: only inside the hub

        handlers: list[tuple[str, Any]] = super().get_handlers(app)
        return [*handlers, (r"/join", JoinHandler)]
