"""Run a hub-managed service so that it ends when the hub does, even a hub killed with SIGKILL.

JupyterHub starts its managed services (the idle culler, the portal gate) as child
processes and stops them when it shuts down cleanly. A hub that is killed (SIGKILL, the
OOM killer) leaves them running. The next hub then starts its own copies, which cannot
bind the port the old ones still hold, while the old portal gate keeps answering with an
OAuth client secret that the new hub has replaced (JupyterHub makes a new token and
secret for each managed service at every start): nobody can log in to the portal.

Usage, as a service ``command``: ``python -m hub.with_hub --hub-pid=PID MODULE [ARGS...]``
(the hub's config knows its own pid). On Linux the kernel sends the service SIGTERM when
its parent dies (``PR_SET_PDEATHSIG``); the setting outlives ``exec`` and applies to this
process only, so a service that starts children of its own passes ``die_with_parent`` to
them as well (spawner/lifetime.py). ``--hub-pid`` covers a hub that died before the setting took effect.

JupyterHub stops a managed service with SIGINT and waits 30 s before SIGTERM. A platform
started with SIGINT ignored (``gpuslice up &`` from a script, nohup) passes that on to the
services, which then sat out the 30 s: Ctrl-C took 32 s. The service gets Python's own
SIGINT handler back before it starts.

The hub token JupyterHub gives the service in its environment is moved to a 0600 file first,
and the wrapper starts itself again without it (spawner/secretenv.py).
"""

from __future__ import annotations

import runpy
import signal
import sys

from spawner import secretenv
from spawner.lifetime import die_with_parent


def main(argv: list[str]) -> None:
    # JupyterHub hands a service its hub token in the environment: move it to a 0600 file and
    # start again without it, so that /proc/PID/environ shows no token (spawner/secretenv.py).
    secretenv.reexec_without_secrets(["-m", "hub.with_hub", *argv])
    secretenv.load_secrets()
    parent = None
    if argv and argv[0].startswith("--hub-pid="):
        parent = int(argv.pop(0).removeprefix("--hub-pid="))
    if not argv:
        raise SystemExit("usage: python -m hub.with_hub [--hub-pid=PID] MODULE [ARGS...]")
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where it was inherited ignored
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
