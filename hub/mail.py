"""Mailing the weekly idle notice (spawner.usage.idle_notices) through an SMTP relay.

Takes its SMTP client (smtplib.SMTP) as an argument, so that tests hand it a real SMTP
server (aiosmtpd) and the CLI one connected to the site's relay.
"""

from __future__ import annotations

import smtplib
from collections.abc import Mapping
from email.message import EmailMessage

from hub.settings import NoticeMail


def notice_message(user: str, text: str, week: str, mail: NoticeMail) -> EmailMessage:
    message = EmailMessage()
    message["From"] = mail.smtp_from
    message["To"] = mail.address.replace("{user}", user)
    message["Subject"] = f"Your idle GPU slices in {week}"
    message.set_content(text)
    return message


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
