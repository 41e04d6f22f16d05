"""A notebook server extension: JupyterLab's "Run as job" asks here, and this asks the hub.

``POST {base_url}gpuslice/run-as-job`` with ``{"path": "work/train.ipynb", "gpu_memory": "4GiB",
"time_limit": "1h"}`` (the owner's JupyterLab, through jupyter_server's own authentication and XSRF
check) submits the notebook as a batch job to the hub's jobs API (hub/jobs_api.py) with this server's
own token (``JUPYTERHUB_API_TOKEN``: JupyterHub's server role, and the user's own servers, which
hub/wiring.py lets a server's token have), and answers with the hub's answer. The hub decides and
checks everything (the owner is the token's user; the notebook must be in the home folder).

Loaded by jupyter_server_config.py beside it; only jupyter_server and tornado are imported: this runs
in the users' environment, not the platform's.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

FIELDS = ("gpu_memory", "time_limit", "image", "priority")  # what the dialog may set besides the notebook
NAME_PREFIX = "Run as job: "
MOST_NAME = 80  # the jobs API's longest name (spawner/jobs.py JobSpec)


def job_name(path: str) -> str:
    """The job's name for a notebook: its path, its start cut off when too long (the file's name says most),
    on one line."""
    shown = "".join(c if ord(c) >= 32 else "?" for c in path)
    room = MOST_NAME - len(NAME_PREFIX)
    if len(shown) > room:
        shown = "…" + shown[-(room - 1) :]
    return NAME_PREFIX + shown


def job_spec(body: Any) -> dict[str, Any]:
    """The jobs API's body for a notebook of this server (ValueError for anything but a JSON object)."""
    if not isinstance(body, dict) or not isinstance(body.get("path"), str):
        raise ValueError('send {"path": "the notebook, from the home folder", "gpu_memory": "4GiB"}')
    path = body["path"]
    spec: dict[str, Any] = {"notebook": path, "name": job_name(path)}
    spec.update({key: body[key] for key in FIELDS if isinstance(body.get(key), str) and body[key]})
    return spec


class RunAsJobHandler(APIHandler):
    @web.authenticated
    async def post(self) -> None:
        try:
            spec = job_spec(self.get_json_body())
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None
        hub = os.environ.get("JUPYTERHUB_API_URL", "").rstrip("/")
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not hub or not token:
            raise web.HTTPError(503, "this server does not run under a gpuslice hub: no jobs API to ask")
        request = HTTPRequest(
            f"{hub}/gpuslice/jobs",
            method="POST",
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            body=json.dumps(spec),
            request_timeout=60,
        )
        try:
            answer = await AsyncHTTPClient().fetch(request)
            status, text = answer.code, answer.body
        except HTTPClientError as exc:
            status, text = exc.code, exc.response.body if exc.response is not None else b"{}"
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(text)


def _load_jupyter_server_extension(server_app: Any) -> None:
    web_app = server_app.web_app
    route = url_path_join(web_app.settings["base_url"], "gpuslice", "run-as-job")
    web_app.add_handlers(".*$", [(route, RunAsJobHandler)])


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpuslice_lab_jobs"}]
