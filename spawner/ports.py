"""Free loopback ports for the processes we start (the gate's Streamlit, benchmarks, tests)."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port that is free now and that this process has not handed out before.

    The kernel may offer the same free port to two binds in a row; a hub given it for
    both its own port and the proxy's API fails to start (seen in CI, twice).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
