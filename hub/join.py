"""/hub/join: a class member or teacher chooses their password with their single-use invite code
(hub/accounts.py). Names are held to the login page's alphabet and failed codes are throttled
like failed passwords (hub/logins.py)."""

from __future__ import annotations

import time
from pathlib import Path

from jupyterhub.handlers import BaseHandler

from hub.accounts import AccountsError, redeem_invite, request_address

# JupyterHub's own page around the form (autoescaped: the name comes from the person typing).
PAGE = """{% extends "page.html" %}
{% block main %}
<div class="container col-md-6 col-md-offset-3" style="max-width: 32rem">
<h1 class="h3">Join your class</h1>
<p>Type your user name, the invite code your teacher gave you and the password you choose.
The code works once; afterwards you log in with your password.</p>
{% if error %}<p class="alert alert-danger" role="alert">{{ error }}</p>{% endif %}
<form action="{{ base_url }}join" method="post">
<input type="hidden" name="_xsrf" value="{{ xsrf }}">
<label for="username" class="form-label">User name</label>
<input id="username" name="username" class="form-control" autocomplete="username" value="{{ username }}" required>
<label for="code" class="form-label">Invite code</label>
<input id="code" name="code" class="form-control" autocomplete="off" required>
<label for="password" class="form-label">Your password</label>
<input id="password" name="password" type="password" class="form-control" autocomplete="new-password" required>
<label for="password2" class="form-label">Your password again</label>
<input id="password2" name="password2" type="password" class="form-control" autocomplete="new-password" required>
<button type="submit" class="btn btn-primary mt-3" id="join">Join and log in</button>
</form>
</div>
{% endblock %}
"""


class JoinHandler(BaseHandler):  # type: ignore[misc]
    async def get(self) -> None:
        self.finish(await self._page(username=self.get_argument("username", "")))

    async def post(self) -> None:
        authenticator = self.authenticator
        name = authenticator.normalize_username(self.get_body_argument("username", ""))
        code = self.get_body_argument("code", "").strip()
        password = self.get_body_argument("password", "")
        if password != self.get_body_argument("password2", ""):
            self.set_status(400)
            self.finish(await self._page(username=name, error="The two passwords differ: type the same one twice."))
            return
        address = request_address(self.request, authenticator.trusted_proxies)
        refusal = authenticator.unsafe_name(name) or authenticator.lockout(name, address)
        if refusal:
            self.set_status(403)
            self.finish(await self._page(username=name, error=refusal))
            return
        try:
            redeem_invite(Path(authenticator.data_dir), name, code, password)
        except AccountsError as exc:
            self.log.warning("refused an invite code for %s", ascii(name)[:32])
            authenticator.throttle().failed(name, address, time.time())
            self.set_status(403)
            self.finish(await self._page(username=name, error=str(exc)))
            return
        user = await self.login_user({"username": name, "password": password})
        self.redirect(self.hub.base_url + ("spawn" if user else "login"))

    async def _page(self, username: str = "", error: str = "") -> str:
        template = self.settings["jinja2_env"].from_string(PAGE)
        namespace = {**self.template_namespace, "username": username, "error": error}
        return str(await template.render_async(namespace))
