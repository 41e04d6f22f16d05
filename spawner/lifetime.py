"""Processes that end when their parent does, even a parent killed with SIGKILL (Linux).

Below the hub and the portal so both use it without importing each other:
hub/with_hub.py runs the hub's managed services under it, and portal/gate.py passes it
to the Streamlit child it starts (hub/with_hub.py says why this matters).
"""

from __future__ import annotations

import ctypes
import os
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
