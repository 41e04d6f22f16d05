"""The hub's roles for its services, one definition for the single-machine and Kubernetes configs.

Each service gets the least it needs (docs/security.md): the culler and the GPU reclaimer
stop idle servers; the portal's own token only reads, and starting or stopping from the
portal uses the reader's OAuth token, limited to ``PORTAL_OAUTH_SCOPES``.
"""

from __future__ import annotations

from typing import Any

STOPS_IDLE_SERVERS = ("list:users", "read:users:activity", "read:servers", "delete:servers")
PORTAL_READS = ("list:users", "read:users", "read:servers", "list:groups", "read:groups")
# The reader's own token, handed to Streamlit by the gate: starting one's own server, and
# (within each user's permissions: an admin's all, anyone else's their own) stopping.
PORTAL_OAUTH_SCOPES = ["read:users:groups!user", "read:users!user", "servers!user", "delete:servers"]
READS_METRICS = ("read:metrics",)
# `gpuslice class ...` changing a running hub's classes (hub/classes_api.py): as an admin of groups.
CHANGES_CLASSES = ("admin:groups", "list:users", "read:users")
# `gpuslice top` on the hub's machine: reads who holds what, idle times and the line; changes nothing.
TOP_READS = ("list:users", "read:users", "read:servers", "read:users:activity", "read:metrics", "list:groups")
# Every user may open the portal (what they see there is checked per request).
USER_ROLE: dict[str, Any] = {"name": "user", "scopes": ["self", "access:services!service=portal"]}


def service_role(service: str, scopes: tuple[str, ...]) -> dict[str, Any]:
    """A role named after its one service, granting ``scopes``."""
    return {"name": service, "scopes": list(scopes), "services": [service]}
