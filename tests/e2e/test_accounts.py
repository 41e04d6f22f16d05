"""Accounts nobody can steal (issue 13), against the real hub: a stranger tries to claim names."""

import os
import subprocess
from pathlib import Path
from typing import Any

import requests

from hub.authenticator import NO_PASSWORD_YET
from tests.e2e.platform import GPUSLICE, PASSWORD, Platform, Session


def try_login(platform: Platform, user: str, password: str) -> requests.Response:
    session = Session(platform.url)
    session.get(f"{platform.url}/hub/login")
    return session.post(
        f"{platform.url}/hub/login",
        data={"username": user, "password": password, "_xsrf": session.xsrf()},
        allow_redirects=False,
    )


def join(platform: Platform, user: str, code: str, password: str) -> requests.Response:
    """A member at /hub/join: their name, an invite code and the password they choose."""
    session = Session(platform.url)
    assert session.get(f"{platform.url}/hub/join").status_code == 200
    form = {"username": user, "code": code, "password": password, "password2": password, "_xsrf": session.xsrf()}
    return session.post(f"{platform.url}/hub/join", data=form, allow_redirects=False)


def gpuslice(*args: str) -> str:
    done = subprocess.run([GPUSLICE, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_stranger_cannot_claim_the_teacher_or_a_class_member(make_platform: Any, tmp_path: Path) -> None:
    platform: Platform = make_platform(groups={"ml101": {"members": ["rosa"]}}, unclaimed=("rosa",))
    roster = tmp_path / "roster.csv"
    roster.write_text("username\nsam\ntess\n")
    invites = tmp_path / "invites.csv"
    printed = gpuslice(
        "class", "add", "cv202", str(roster), "--config", str(platform.config), "--invites", str(invites)
    )
    assert "2 invite codes" in printed and "sam," not in printed  # written to the file, not the terminal
    assert os.stat(invites).st_mode & 0o777 == 0o600
    codes = dict(line.split(",") for line in invites.read_text().splitlines()[1:])
    platform.start()

    # The teacher (an admin) and a roster member who has not joined yet: typing a password claims nothing.
    for name in ("admin", "rosa"):
        claim = try_login(platform, name, "the-strangers-password")
        assert claim.status_code == 403, (name, claim.status_code)
        assert try_login(platform, name, "the-strangers-password").status_code == 403  # still not theirs
    assert "no password yet" in try_login(platform, "rosa", "another-guess").text
    assert NO_PASSWORD_YET.format(name="rosa").split(":")[0] in try_login(platform, "rosa", "x" * 12).text
    platform.login("admin")  # the admin's password (from admin_password_from) still works

    # An admin gives rosa a password; the invite codes let cv202's members in, and only with them.
    reset = gpuslice("user", "set-password", "rosa", "--config", str(platform.config))
    rosa_password = reset.strip().rsplit(" ", 1)[1]
    platform.login("rosa", rosa_password)
    assert try_login(platform, "sam", "a-guess-at-the-code").status_code == 403
    # A code is no password; at /hub/join it opens its own member's account once.
    refused = try_login(platform, "sam", codes["sam"])
    assert refused.status_code == 403 and "/hub/join" in refused.text
    assert join(platform, "tess", codes["sam"], "tess-took-sams-code").status_code == 403  # another's code
    joined = join(platform, "sam", codes["sam"], "sams-own-password")
    assert joined.status_code == 302 and joined.headers["Location"].endswith("/hub/spawn"), joined.text[:300]
    assert join(platform, "sam", codes["sam"], "a-strangers-password").status_code == 403  # spent
    assert try_login(platform, "sam", codes["sam"]).status_code == 403
    platform.login("sam", "sams-own-password")
    assert join(platform, "tess", codes["tess"], "tess-own-password").status_code == 302
    platform.login("tess", "tess-own-password")

    # Open sign-up (the default here) still lets a new name choose its password, once.
    platform.login("newcomer", PASSWORD)
    assert try_login(platform, "newcomer", "someone-elses-guess").status_code == 403
