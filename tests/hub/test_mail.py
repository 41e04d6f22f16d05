"""The weekly idle notice mailed through a real SMTP server (aiosmtpd) with smtplib (hub/mail.py)."""

import smtplib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from hub import mail
from hub.settings import NoticeMail, SettingsError, from_mapping
from spawner.ports import free_port


class Inbox:
    """Keeps every message the server accepts; refuses mail to refused@..."""

    def __init__(self) -> None:
        self.received: list[tuple[list[str], Any]] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:  # noqa: N802
        if address.startswith("refused@"):
            return "550 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.received.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


@pytest.fixture
def relay() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def settings_for(port: int) -> NoticeMail:
    raw = {"notice_mail": {"smtp_smarthost": f"127.0.0.1:{port}", "smtp_from": "gpuslice@example.org",
                           "address": "{user}@students.example.org"}}  # fmt: skip
    notice_mail = from_mapping(raw, "test").notice_mail
    assert notice_mail is not None
    return notice_mail


@pytest.mark.process
def test_each_idle_holder_gets_their_notice_by_mail(relay: tuple[Inbox, int]) -> None:
    inbox, port = relay
    notices = {"bob": "Hello bob,\n\nyou held 5.0 GPU-hours idle.\n", "ann": "Hello ann,\n\n2.5 idle.\n"}
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        sent = mail.send_notices(notices, "2026-W47", settings_for(port), smtp)
    assert sent == ["ann@students.example.org", "bob@students.example.org"]
    assert [rcpt for rcpt, _ in inbox.received] == [["ann@students.example.org"], ["bob@students.example.org"]]
    _, message = inbox.received[1]
    assert message["From"] == "gpuslice@example.org" and message["Subject"] == "Your idle GPU slices in 2026-W47"
    assert message.get_payload(decode=True).decode().replace("\r\n", "\n") == notices["bob"]  # SMTP sends CRLF


@pytest.mark.process
def test_a_refused_address_is_named_and_the_count_sent_said(relay: tuple[Inbox, int]) -> None:
    inbox, port = relay
    relay_settings = settings_for(port).model_copy(update={"address": "refused@example.org"})
    refused = pytest.raises(RuntimeError, match=r"refused@example\.org")
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp, refused:
        mail.send_notices({"ann": "text"}, "2026-W47", relay_settings, smtp)
    assert inbox.received == []


def test_bad_notice_mail_settings_are_refused_naming_the_key() -> None:
    with pytest.raises(SettingsError, match="notice_mail"):
        from_mapping({"notice_mail": {"smtp_smarthost": "mail.example.org", "smtp_from": "a@b"}}, "test")
    with pytest.raises(SettingsError, match="notice_mail"):
        from_mapping({"notice_mail": {"smtp_smarthost": "m:25", "smtp_from": "a@b", "address": "all@x.org"}}, "test")


@pytest.mark.process
def test_send_without_notice_mail_stops_before_asking_prometheus(tmp_path: Path) -> None:
    config = tmp_path / "gpuslice.yaml"
    config.write_text("data_dir: data\n")
    result = subprocess.run(
        [sys.executable, "-m", "hub.cli", "usage", "--config", str(config), "--notices", str(tmp_path), "--send"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "notice_mail" in result.stderr, result.stderr


class Accounts:
    """The relay's one account; remembers who logged in."""

    def __init__(self, user: str, password: str) -> None:
        self.account = (user.encode(), password.encode())
        self.logins: list[str] = []

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        if isinstance(data, LoginPassword) and (data.login, data.password) == self.account:
            self.logins.append(data.login.decode())
            return AuthResult(success=True)
        return AuthResult(success=False, handled=False)


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, as a site's own CA would issue)."""
    cert, key = folder / "relay.crt", folder / "relay.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_relay(tmp_path: Path) -> Iterator[tuple[Inbox, Accounts, int, Path]]:
    """A relay that takes mail only after STARTTLS and a login, as a site's submission port does."""
    cert, key = certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    inbox, accounts, port = Inbox(), Accounts("gpuslice", "s3cret pass"), free_port()
    controller = Controller(
        inbox, hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True,
        authenticator=accounts, auth_required=True, auth_require_tls=True,
    )  # fmt: skip
    controller.start()
    try:
        yield inbox, accounts, port, cert
    finally:
        controller.stop()


def login_settings(port: int, cert: Path | None, password_file: Path) -> NoticeMail:
    raw = {
        "smtp_smarthost": f"127.0.0.1:{port}",
        "smtp_from": "gpuslice@example.org",
        "starttls": True,
        "username": "gpuslice",
        "password_file": str(password_file),
        "ca_file": str(cert) if cert else None,
    }
    notice_mail = from_mapping({"notice_mail": raw}, "test").notice_mail
    assert notice_mail is not None
    return notice_mail


@pytest.mark.process
def test_notices_go_over_starttls_with_a_login_read_from_a_file(
    tls_relay: tuple[Inbox, Accounts, int, Path], tmp_path: Path
) -> None:
    inbox, accounts, port, cert = tls_relay
    password = tmp_path / "relay-password"
    password.write_text("s3cret pass\n")  # as `echo` writes it: the newline is not part of the password
    relay_settings = login_settings(port, cert, password)
    assert "s3cret" not in repr(relay_settings)  # the settings hold the file's name only
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        mail.secure(smtp, relay_settings)
        sent = mail.send_notices({"ann": "2.5 idle.\n"}, "2026-W47", relay_settings, smtp)
    assert sent == ["ann@localhost"] and [rcpt for rcpt, _ in inbox.received] == [["ann@localhost"]]
    assert accounts.logins == ["gpuslice"]


@pytest.mark.process
def test_without_starttls_and_login_the_relay_takes_nothing(tls_relay: tuple[Inbox, Accounts, int, Path]) -> None:
    inbox, _, port, _ = tls_relay
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp, pytest.raises(RuntimeError, match="refused the notice"):
        mail.send_notices({"ann": "text"}, "2026-W47", settings_for(port), smtp)
    assert inbox.received == []


@pytest.mark.parametrize(
    ("password", "trusted", "told"),
    [
        ("wrong", True, "refused the login of gpuslice (535): check notice_mail.username and the password in"),
        (None, True, "cannot read notice_mail.password_file"),
        ("", True, "is empty: write the relay password on its first line"),
        ("s3cret pass", False, "CERTIFICATE_VERIFY_FAILED"),
    ],
    ids=["wrong-password", "no-file", "empty-file", "untrusted-certificate"],
)
@pytest.mark.process
def test_a_failed_login_or_certificate_says_what_to_fix_and_sends_nothing(
    tls_relay: tuple[Inbox, Accounts, int, Path], tmp_path: Path, password: str | None, trusted: bool, told: str
) -> None:
    inbox, accounts, port, cert = tls_relay
    password_file = tmp_path / "relay-password"
    if password is not None:
        password_file.write_text(password)
    relay_settings = login_settings(port, cert if trusted else None, password_file)
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp, pytest.raises((RuntimeError, ssl.SSLError)) as error:
        mail.secure(smtp, relay_settings)
    assert told in str(error.value)
    assert "s3cret" not in str(error.value)
    assert (inbox.received, accounts.logins) == ([], [])


@pytest.mark.parametrize(
    ("extra", "told"),
    [
        ({"username": "gpuslice", "password_file": "/run/pw"}, "a login needs starttls: true"),
        ({"username": "gpuslice", "starttls": True}, "username and password_file go together"),
        ({"password": "s3cret"}, "notice_mail: unknown key(s) password (did you mean password_file?)"),
    ],
)
def test_a_login_without_tls_or_a_password_in_the_settings_is_refused(extra: dict[str, Any], told: str) -> None:
    raw = {"smtp_smarthost": "mail.example.org:587", "smtp_from": "gpuslice@example.org", **extra}
    with pytest.raises(SettingsError, match="notice_mail") as error:
        from_mapping({"notice_mail": raw}, "test")
    assert told in str(error.value)
