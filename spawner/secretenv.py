"""Secrets out of process environments: handed over in a 0600 file instead (issue 13).

Anyone who runs as a process's account can read ``/proc/PID/environ``, and it shows the
environment the process was *started* with for as long as it runs, whatever the process
later changes. JupyterHub hands its managed services their hub token there
(``JUPYTERHUB_API_TOKEN``), and the portal gate gave Streamlit its identity key the same way.

So a process that receives secrets in its environment moves them to a file only its account
can read, starts itself again without them (``reexec_without_secrets``), and, as its first
act after that, reads the file, deletes it and puts the secrets back into ``os.environ``
(``load_secrets``), where its own code finds them but ``/proc/PID/environ`` does not show
them. A child is given its secrets the same way (``child_env``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence

from spawner import environ

# The environment variables that hold secrets: hub API tokens (JupyterHub sets both names
# for a managed service) and the portal's identity key.
SECRET_NAMES = ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", environ.PORTAL_SECRET.name)
FILE_VAR = environ.SECRETS_FILE.name
# Streamlit runs each session's first page in its own thread: the second must wait until the
# first has put the secrets in os.environ, not find the file's name gone and go on without them.
_LOADING = threading.Lock()


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without its secrets, which go to a new 0600 file named in it (read by ``load_secrets``)."""
    secrets = {name: env[name] for name in SECRET_NAMES if env.get(name)}
    clean = {name: value for name, value in env.items() if name not in SECRET_NAMES and name != FILE_VAR}
    if not secrets:
        return clean
    fd, path = tempfile.mkstemp(prefix="gpuslice-secrets-")  # mode 0600, in a folder others cannot list
    with os.fdopen(fd, "w") as file:
        json.dump(secrets, file)
    return clean | {FILE_VAR: path}


def reexec_without_secrets(args: Sequence[str]) -> None:
    """Start this Python program again as ``python ARGS`` when secrets are in its starting environment."""
    if any(os.environ.get(name) for name in SECRET_NAMES):
        os.execve(sys.executable, [sys.executable, *args], child_env(os.environ))


def load_secrets() -> None:
    """The secrets a parent put in our file: into ``os.environ`` (not ``/proc/PID/environ``); the file goes.

    Safe to call from many threads at once: each returns only once the secrets are in place.
    """
    with _LOADING:
        path = os.environ.get(FILE_VAR, "")
        if not path:
            return  # read already (Streamlit runs the app again for each page)
        try:
            with open(path) as file:
                secrets = json.load(file)
        except FileNotFoundError:
            secrets = {}  # gone with no one to read it: the caller says which secret it lacks
        os.environ.update({name: str(value) for name, value in secrets.items() if name in SECRET_NAMES})
        del os.environ[FILE_VAR]  # last: a thread that finds the name gone finds the secrets there
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
