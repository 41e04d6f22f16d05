"""hub/reclaimer.py's reading of JupyterHub's users (the service itself runs in tests/e2e/test_waiting_line.py)."""

from hub.reclaimer import holders_from_hub
from spawner.waitline import Holder


def test_ready_servers_become_holders_with_their_last_activity() -> None:
    users = [
        {
            "name": "ann",
            "servers": {
                "": {"ready": True, "last_activity": "2026-11-23T07:00:00.000000Z"},
                "big": {"ready": False, "last_activity": "2026-11-23T07:00:00Z"},  # still starting: not a holder
            },
        },
        {"name": "bo", "servers": {"cpu": {"ready": True, "last_activity": None}}},
    ]
    holders = holders_from_hub(users, gpu_keys={"ann/"})
    assert holders == [Holder("ann/", True, 1795417200.0, 1795417200.0), Holder("bo/cpu", False, None, None)]
