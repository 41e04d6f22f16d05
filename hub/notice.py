"""`/hub/gpuslice/notice`: the GPU line's warnings and stops for the logged-in user's servers, as JSON.

JupyterLab shows them as notifications (the prebuilt extension in spawner/lab, loaded by every
local server), and the hub's home page shows them too. Cookie-authenticated like the hub's own
pages: a user sees only the warnings of their own servers (the spawner reads them from the ledger).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from jupyterhub.handlers import BaseHandler
from tornado import web

from hub.homes import HOME_NOTICE
from spawner.waitline import NOTICE_LOOK_EVERY_S, notice_look_interval


def notices(spawners: dict[str, Any]) -> list[dict[str, str]]:
    """For these servers (name -> spawner): each reclaim warning standing now (``kind`` "warning": JupyterLab
    saves every open document when it comes), and each stop by the GPU line's reclaimer of the last day
    (``kind`` "stop", shown once in the next JupyterLab of that server), one of each per server at most."""
    found = []
    for name, spawner in sorted(spawners.items()):
        warning = getattr(spawner, "gpu_reclaim_warning", None)
        said = warning() if callable(warning) else None
        if said:
            text, since = said
            found.append({"server": name, "id": f"{name}@{since}", "message": text, "kind": "warning"})
        stop = getattr(spawner, "gpu_reclaim_stop", None)
        stopped = stop() if callable(stop) else None
        if stopped:
            text, at = stopped
            found.append({"server": name, "id": f"stop:{name}@{at}", "message": text, "kind": "stop"})
    return found


def next_look_s(spawners: dict[str, Any]) -> float:
    """The shortest look interval among these servers' warning leads (spawner/waitline.py)."""
    leads = [float(s.gpu_warning_lead) for s in spawners.values() if hasattr(s, "gpu_warning_lead")]
    return min((notice_look_interval(lead) for lead in leads), default=NOTICE_LOOK_EVERY_S)


def home_notices(words: str | None) -> list[dict[str, str]]:
    """The home folder's warning as a notice (its id changes with its words, so a new size is shown again)."""
    return (
        [{"server": "", "id": f"home@{zlib.crc32(words.encode()):x}", "message": words, "kind": "home"}]
        if words
        else []
    )


class NoticeHandler(BaseHandler):  # type: ignore[misc]
    @web.authenticated
    def get(self) -> None:
        user = self.current_user
        spawners = dict(user.spawners)
        home = (self.settings.get("template_vars") or {}).get(HOME_NOTICE)
        found = notices(spawners) + home_notices(home(user) if callable(home) else None)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"notices": found, "next_look_s": next_look_s(spawners)}))
