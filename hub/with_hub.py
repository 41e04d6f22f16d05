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
them as well. ``--hub-pid`` covers a hub that died before the setting took effect.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent: int | None = None, signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this process when its parent process ends (Linux).

    ``parent``: the pid the parent should have; if it is not the parent any more, the
    parent died before the setting took effect, and the signal is sent now.
    """
    if not sys.platform.startswith("linux"):
        return  # the single-machine platform runs on Linux; elsewhere a killed hub leaves services behind
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def main(argv: list[str]) -> None:
    parent = None
    if argv and argv[0].startswith("--hub-pid="):
        parent = int(argv.pop(0).removeprefix("--hub-pid="))
    if not argv:
        raise SystemExit("usage: python -m hub.with_hub [--hub-pid=PID] MODULE [ARGS...]")
    die_with_parent(parent)
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
