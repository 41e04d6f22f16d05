"""Look-alike names and throttled logins (hub/logins.py), and the authenticator that applies them."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hub.accounts import invite_codes, passwords_path, set_password
from hub.authenticator import GpusliceAuthenticator
from hub.logins import Limit, LoginThrottle, client_address, locked_for, name_problem, normalize_name


@pytest.mark.parametrize(
    ("typed", "kept"),
    [("Tessa", "tessa"), ("ｔｅｓｓａ", "tessa"), (" tessa ", "tessa"), ("STRASSE", "strasse"), ("Straße", "strasse")],
)
def test_names_are_kept_as_people_read_them(typed: str, kept: str) -> None:
    assert normalize_name(typed) == kept
    assert name_problem(normalize_name(typed)) is None


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ("tess\u0430", "'а' (U+0430 CYRILLIC SMALL LETTER A)"),  # a Cyrillic а
        ("tessa\u200b", "an invisible character (U+200B ZERO WIDTH SPACE)"),
        ("te\u00adssa", "an invisible character (U+00AD SOFT HYPHEN)"),
        ("al ice", "a space"),
        ("bob/../admin", "'/' (U+002F SOLIDUS)"),
        (".hidden", "must start with a letter or a digit"),
        ("x" * 65, "is 65 characters long"),
        ("", "Type a user name"),
    ],
)
def test_a_look_alike_or_unsafe_name_is_refused_naming_what_to_type(typed: str, said: str) -> None:
    problem = name_problem(normalize_name(typed))
    assert problem is not None and said in problem
    assert "letters a-z, digits 0-9 and . _ - @" in problem  # what to type instead


def test_the_address_is_the_proxys_last_hop_not_what_the_client_wrote() -> None:
    assert client_address(None, "10.0.0.7") == "10.0.0.7"
    # configurable-http-proxy appends the peer it saw; hops before it are the client's to write
    assert client_address("1.2.3.4, 10.0.0.7", "127.0.0.1") == "10.0.0.7"
    # nginx on this machine in front of the proxy: its loopback hop is skipped by default
    assert client_address("203.0.113.9, 127.0.0.1", "127.0.0.1") == "203.0.113.9"
    assert client_address("127.0.0.1", "127.0.0.1") == "127.0.0.1"  # a browser on this machine
    # an ingress in front: its hop is skipped once its network is named as trusted
    assert client_address("203.0.113.9, 10.1.0.2", "10.1.0.5", trusted={"10.1.0.0/16"}) == "203.0.113.9"
    assert client_address("203.0.113.9, 10.1.0.2", "10.1.0.5") == "10.1.0.2"  # not named: the ingress counts
    assert client_address("not-an-address, 10.1.0.2", "10.1.0.5", trusted={"10.1.0.0/16"}) == "not-an-address"


def test_a_lockout_lasts_until_the_oldest_counted_failure_ages_out() -> None:
    limit = Limit(failures=3, window_s=60)
    assert locked_for([], limit, now=100) == 0
    assert locked_for([10, 20], limit, now=30) == 0  # two failures: not yet
    assert locked_for([10, 20, 30], limit, now=30) == 40  # until 10 + 60
    assert locked_for([10, 20, 30], limit, now=70) == 0  # 10 aged out: two left in the window
    assert locked_for([10, 20, 30, 75], limit, now=76) == 4  # three again: until 20 + 60
    assert locked_for([1, 2, 3], Limit(0, 60), now=3) == 0  # 0: no limit


def test_the_throttle_counts_per_name_and_per_address_in_a_file_that_outlives_the_process(tmp_path: Path) -> None:
    path = tmp_path / "logins.sqlite"

    def throttle() -> LoginThrottle:  # a new one each time, as a restarted hub (or a second process) would make
        return LoginThrottle(path, per_name=Limit(3, 300), per_address=Limit(5, 60))

    for t in range(3):
        throttle().failed("bob", "10.0.0.1", now=1000 + t)
    refusal = throttle().refusal("bob", "10.0.0.9", now=1010)  # any address: the name is locked
    assert refusal is not None and "Too many failed logins for bob: try again in 5 min" in refusal
    assert "gpuslice user set-password" in refusal
    assert throttle().refusal("carol", "10.0.0.9", now=1010) is None
    assert throttle().refusal("bob", "10.0.0.9", now=1300) is None  # expired by itself

    for name in ("d1", "d2"):  # the address: 3 (bob) + 2 failures within its minute
        throttle().failed(name, "10.0.0.1", now=1020)
    said = throttle().refusal("carol", "10.0.0.1", now=1030)
    assert said is not None and "from your address: try again in" in said
    assert throttle().refusal("carol", "10.0.0.1", now=1061) is None  # the address's minute is over

    throttle().forget("bob")  # logged in, or an admin reset the password
    assert throttle().refusal("bob", "10.0.0.2", now=1010) is None


def login_handler(forwarded_for: str = "") -> Any:
    """What the authenticator reads of JupyterHub's login handler (a tornado request behind the proxy)."""
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    request = SimpleNamespace(
        headers=headers,
        remote_ip="127.0.0.1",
        connection=SimpleNamespace(context=SimpleNamespace(address=("127.0.0.1", 50000))),
    )
    return SimpleNamespace(request=request, hub=SimpleNamespace(base_url="/hub/"), custom_login_error="")


def authenticator(tmp_path: Path, **traits: Any) -> GpusliceAuthenticator:
    return GpusliceAuthenticator(dbm_path=str(passwords_path(tmp_path)), data_dir=str(tmp_path), **traits)


def log_in(auth: GpusliceAuthenticator, name: str, password: str, forwarded_for: str = "10.0.0.1") -> str | None:
    return attempt(auth, name, password, forwarded_for)[0]


def attempt(
    auth: GpusliceAuthenticator, name: str, password: str, forwarded_for: str = "10.0.0.1"
) -> tuple[str | None, str]:
    """The name logged in (or None), and what the login page says (FirstUseAuthenticator shows custom_login_error)."""
    handler = login_handler(forwarded_for)
    result: str | None = asyncio.run(auth.authenticate(handler, {"username": name, "password": password}))
    return result, handler.custom_login_error


def said(auth: GpusliceAuthenticator, name: str, password: str, forwarded_for: str = "10.0.0.1") -> str:
    """What the login page says to a refused login."""
    result, message = attempt(auth, name, password, forwarded_for)
    assert result is None, f"{name} logged in"
    return message


def test_a_look_alike_of_a_name_gets_no_account_of_its_own(tmp_path: Path) -> None:
    auth = authenticator(tmp_path)
    assert log_in(auth, "tessa", "tessas-password") == "tessa"  # open sign-up, the real tessa
    for look_alike in ("tess\u0430", "tessa\u200b"):
        assert "type it with letters a-z" in said(auth, look_alike, "mallorys-password")
        assert not auth.validate_username(auth.normalize_username(look_alike))  # the admin API refuses it too
    assert log_in(auth, "ＴＥＳＳＡ", "tessas-password") == "tessa"  # the same account, not a second one
    assert log_in(auth, "ＴＥＳＳＡ", "mallorys-password") is None


def test_the_eleventh_wrong_password_locks_the_name_even_for_the_right_one(tmp_path: Path) -> None:
    set_password(passwords_path(tmp_path), "bob", "bobs-password")
    auth = authenticator(tmp_path)
    for attempt in range(10):
        assert log_in(auth, "bob", f"guess-{attempt}", forwarded_for=f"10.0.1.{attempt}") is None
    assert "Too many failed logins for bob" in said(auth, "bob", "bobs-password", forwarded_for="10.0.2.1")
    assert log_in(authenticator(tmp_path, allowed_failed_logins=0), "bob", "bobs-password") == "bob"  # 0: off


def test_twenty_failures_from_one_address_lock_it_for_every_name(tmp_path: Path) -> None:
    set_password(passwords_path(tmp_path), "carol", "carols-password")
    auth = authenticator(tmp_path)
    for attempt in range(20):  # new names, each with too short a password: failures (said so, HTTP 403)
        assert "Password too short" in said(auth, f"name{attempt}", "short")
    assert "from your address" in said(auth, "carol", "carols-password")
    assert log_in(auth, "carol", "carols-password", forwarded_for="10.9.9.9") == "carol"  # another address


def test_a_teacher_or_an_invited_name_cannot_be_claimed(tmp_path: Path) -> None:
    from hub.accounts import roster_names
    from spawner.quotas import read_groups

    known = roster_names(["admin"], read_groups({"ml101": {"members": ["bob"], "teachers": ["Tina"]}}))
    assert known == {"admin", "bob", "tina"}
    auth = authenticator(tmp_path, known_names=known)
    assert "cannot be claimed" in said(auth, "tina", "mallory-was-here")
    invite_codes(tmp_path, ["guest"])  # `gpuslice user invite guest`: known from then on
    assert "/hub/join" in said(auth, "guest", "mallory-was-here")
    assert log_in(auth, "stranger", "strangers-own") == "stranger"  # open sign-up: names nobody knows


def test_a_trusted_proxy_must_be_an_address_or_a_network(tmp_path: Path) -> None:
    from traitlets import TraitError

    with pytest.raises(TraitError, match="'nginx' is not an address or a network"):
        authenticator(tmp_path, trusted_proxies=["nginx"])
    set_password(passwords_path(tmp_path), "dana", "danas-password")
    set_password(passwords_path(tmp_path), "eli", "elis-password")
    behind_ingress = authenticator(tmp_path, trusted_proxies=["10.42.0.0/16"], allowed_failed_logins_per_address=1)
    assert log_in(behind_ingress, "dana", "a-guess", forwarded_for="198.51.100.7, 10.42.3.9") is None
    assert "from your address" in said(behind_ingress, "dana", "danas-password", "198.51.100.7, 10.42.3.9")
    assert log_in(behind_ingress, "eli", "elis-password", forwarded_for="203.0.113.5, 10.42.3.9") == "eli"
