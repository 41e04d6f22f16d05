"""Mailing the weekly idle notice (spawner.usage.idle_notices) through an SMTP relay.

Takes its SMTP client (smtplib.SMTP) as an argument, so that tests hand it a real SMTP
server (aiosmtpd) and the CLI one connected to the site's relay.
"""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Mapping
from email.message import EmailMessage
from pathlib import Path

from hub.secret_files import first_line
from hub.settings import NoticeMail


def notice_message(user: str, text: str, week: str, mail: NoticeMail) -> EmailMessage:
    message = EmailMessage()
    message["From"] = mail.smtp_from
    message["To"] = mail.address.replace("{user}", user)
    message["Subject"] = f"Your idle GPU slices in {week}"
    message.set_content(text)
    return message


def relay_password(path: Path) -> str:
    """The relay password: the file's first line, read when mailing (never kept in settings or the environment)."""
    return first_line(
        path,
        "notice_mail.password_file",
        unreadable="write the relay password into it (chmod 600) or remove username and password_file",
        empty="write the relay password on its first line",
        error=RuntimeError,
    )


def secure(smtp: smtplib.SMTP, mail: NoticeMail) -> None:
    """STARTTLS with the relay's certificate checked, then SMTP AUTH, as notice_mail says (nothing when unset)."""
    if mail.starttls:
        smtp.starttls(context=ssl.create_default_context(cafile=str(mail.ca_file) if mail.ca_file else None))
    if mail.username and mail.password_file:
        password = relay_password(mail.password_file)
        try:
            smtp.login(mail.username, password)
        except smtplib.SMTPAuthenticationError as exc:
            raise RuntimeError(
                f"the mail relay {mail.smtp_smarthost} refused the login of {mail.username} ({exc.smtp_code}): "
                f"check notice_mail.username and the password in {mail.password_file}"
            ) from None


def send_notices(notices: Mapping[str, str], week: str, mail: NoticeMail, smtp: smtplib.SMTP) -> list[str]:
    """Each notice mailed to its user's address; the addresses, in user order. A refused one raises, naming it."""
    sent: list[str] = []
    for user, text in sorted(notices.items()):
        message = notice_message(user, text, week, mail)
        try:
            smtp.send_message(message)
        except smtplib.SMTPException as exc:
            raise RuntimeError(
                f"the mail relay {mail.smtp_smarthost} refused the notice to {message['To']} ({exc}); "
                f"{len(sent)} of {len(notices)} were sent, the rest are only in the notices folder"
            ) from exc
        sent.append(str(message["To"]))
    return sent
