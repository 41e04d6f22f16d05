import pytest

from portal.identity import Identity, IdentityError, sign, verify

SECRET = b"s" * 32


def test_round_trip() -> None:
    identity = Identity("alice", admin=False, groups=("ml101",))
    assert verify(sign(identity, SECRET), SECRET) == identity


def test_forged_tampered_expired_and_missing_are_refused() -> None:
    good = sign(Identity("alice"), SECRET)
    with pytest.raises(IdentityError, match="not signed by the portal's gate"):
        verify(sign(Identity("alice", admin=True), b"another secret" * 3), SECRET)
    mac = good.rsplit(".", 1)[1]
    forged_body = sign(Identity("mallory", admin=True), SECRET).rsplit(".", 1)[0]
    with pytest.raises(IdentityError, match="not signed"):
        verify(f"{forged_body}.{mac}", SECRET)
    with pytest.raises(IdentityError, match="expired"):
        verify(sign(Identity("alice"), SECRET, now=0), SECRET)
    with pytest.raises(IdentityError, match="not logged in"):
        verify(None, SECRET)
    with pytest.raises(IdentityError, match="not signed"):
        verify("garbage", SECRET)
