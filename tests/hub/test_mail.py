"""The weekly idle notice mailed through a real SMTP server (aiosmtpd) with smtplib (hub/mail.py)."""

import smtplib
import subprocess
import sys
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

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
