"""Loaded by every gpuslice notebook server (JUPYTER_CONFIG_PATH): an open page is not use.

jupyter_server counts every API request as activity, and JupyterLab, while its tab is open
and visible, asks for the kernels, sessions, terminals and files every few seconds. So a
server whose owner left the room with the page on the screen looked busy forever: neither
the GPU line's reclaimer nor the idle culler could ever take its slice. Here only requests
that change something count (saving, starting or interrupting a kernel, opening a
terminal); kernels and terminals keep counting their own activity as before, so running a
cell, typing in a terminal and JupyterLab's autosave of an edited notebook are all use. One
write is not: JupyterLab saves its own layout (the workspace) every ten seconds or so while a
notebook is open, whether or not anyone is there.

The hub no longer reads the proxy's traffic as activity either (``last_activity_interval``
0, set by hub/wiring.py for every hub): what the server reports is what counts.
A user can run their own server without this file; they gain nothing they could not have
by running a cell now and then, which any user may do.

It also turns on the server's presence reports (gpuslice_presence.py, beside it) and JupyterLab's
"Run as job" (gpuslice_lab_jobs.py beside it: the notebook submitted to the hub's jobs API as a batch job),
and keeps jupyter-lsp's search for language servers to the server's own folders (search_language_servers_nearby).

Only jupyter_server is imported: this runs in the users' environment, not the platform's.
"""
# ruff: noqa: F821  (`c` and `__file__` are given by the config loader that runs this file)

import os
import sys

READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
# Writes an open page makes by itself (seen in JupyterLab 4 with a notebook open: a PUT of the
# workspace every ten seconds), and the platform's lab extension's presence beats
# (gpuslice_presence.py: input in a page is presence, told to the hub apart from activity).
PAGE_STATE = ("/lab/api/workspaces", "/api/gpuslice/presence")


def is_use(method: str, path: str) -> bool:
    """Whether an API request is someone using the server, not an open page keeping itself current."""
    return method not in READ_ONLY and not any(part in path for part in PAGE_STATE)


def count_only_changes() -> bool:
    """Make jupyter_server count an API request as activity only if it may change something.

    Returns whether it is in place (False where jupyter_server has no such hook: it then
    counts every request, as before).
    """
    try:
        from jupyter_server.base.handlers import APIHandler
    except ImportError:
        return False
    counted = getattr(APIHandler, "update_api_activity", None)
    if counted is None:
        return False
    if getattr(counted, "gpuslice_counts_changes_only", False):
        return True  # loaded twice (two config dirs name this file): already in place

    def update_api_activity(self: APIHandler) -> None:
        if is_use(self.request.method or "GET", self.request.path):
            counted(self)

    update_api_activity.gpuslice_counts_changes_only = True  # type: ignore[attr-defined]
    APIHandler.update_api_activity = update_api_activity  # type: ignore[method-assign]
    return True


count_only_changes()


def load_extensions(config: object, here: str) -> None:
    """Load the server extensions beside this file (a folder every account can read): gpuslice_presence (the
    server tells the hub whether its owner is there, docs/platform.md#presence) and gpuslice_lab_jobs
    (JupyterLab's "Run as job", docs/jobs.md)."""
    if here not in sys.path:
        sys.path.append(here)
    extensions = {"gpuslice_presence": True, "gpuslice_lab_jobs": True}
    config.ServerApp.jpserver_extensions.update(extensions)  # type: ignore[attr-defined]


def search_language_servers_nearby(config: object) -> None:
    """Let jupyter-lsp look for language servers only in the server's own folders.

    JupyterLab 4 installs jupyter-lsp, whose server looks for about twenty node-based language servers
    at every start, in places that include npm's global folder, which it learns by running
    ``npm prefix -g`` (a Node.js start, where npm is installed, as it is beside the hub's proxy) and
    JupyterLab's build folder: 0.3 s of CPU of each notebook server's start (docs/load.md), paid by
    every student of a class who presses Start, on the same cores. It still looks where a user's or an
    image's language servers are: the server's working folder and its Python environment. A language
    server installed elsewhere is named in ``c.LanguageServerManager.extra_node_roots`` (a user's
    ~/.jupyter/jupyter_server_config.py may set it: this file leaves it alone).
    """
    config.LanguageServerManager.node_roots = [os.getcwd(), os.path.join(sys.prefix, "lib"), sys.prefix]  # type: ignore[attr-defined]


if "c" in globals():  # run by jupyter_server as a config file (c: its config); a test imports it plainly
    load_extensions(c, os.path.dirname(os.path.abspath(__file__)))  # type: ignore[name-defined]
    search_language_servers_nearby(c)  # type: ignore[name-defined]
