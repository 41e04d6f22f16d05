"""Who may do what, checked over real HTTP: anonymous, a student, another class's student, an admin."""

from typing import Any

import requests

from market.store import Image, Store
from tests.e2e.platform import Platform, Session


def test_authorization_matrix(make_platform: Any) -> None:
    platform: Platform = make_platform(
        groups={"ml101": {"members": ["ann"]}, "cv202": {"members": ["cal"]}}, open_signup=False
    )
    platform.start()
    store = Store(f"sqlite:///{platform.data_dir / 'market.sqlite'}")
    store.save_image(Image("ml-lab", "ML lab", "1", "python", local_path="@platform", groups=("ml101",)), "admin")
    ann, cal, admin = platform.login("ann"), platform.login("cal"), platform.login("admin")
    hub = f"{platform.url}/hub/api"

    # Anonymous: no API, no portal page.
    assert requests.get(f"{hub}/users", timeout=10).status_code == 403
    assert requests.post(f"{hub}/users/ann/server", json={}, timeout=10).status_code == 403
    portal = requests.get(f"{platform.url}/services/portal/", allow_redirects=False, timeout=10)
    assert portal.status_code == 302 and "oauth2/authorize" in portal.headers["Location"]

    # A student: their own things only.
    assert ann.api("GET", "/users/ann").status_code == 200
    assert ann.api("GET", "/users").status_code == 403
    assert ann.api("GET", "/users/cal").status_code == 404  # another user does not exist, as far as ann can tell
    assert ann.api("POST", "/users/cal/server", json={}).status_code == 404
    assert ann.api("GET", "/../metrics").status_code == 403

    # The GPU line's API (where the portal's Queue takes its estimates): nobody anonymous, a
    # student sees only their own place and may not change the line.
    assert requests.get(f"{hub}/gpuslice/line", timeout=10).status_code == 403
    assert ann.api("GET", "/gpuslice/line").json()["line"] == []
    for action in ({"action": "cancel", "user": "cal", "server": ""}, {"action": "drop-reservation", "id": 1}):
        refused = ann.api("POST", "/gpuslice/line", json=action)
        assert refused.status_code == 403, refused.text

    # Another class's student: the class's image is refused, on the server side.
    refused = cal.api("POST", "/users/cal/server", json={"image": "ml-lab"})
    assert refused.status_code == 403 and "only for the groups ml101" in refused.json()["message"]
    assert platform.ledger() == []
    assert ann.api("POST", "/users/ann/server", json={"image": "ml-lab"}).status_code in (201, 202)
    ann.wait_ready("ann")

    # The portal's service token only reads (issue 13): it cannot start or stop a server.
    as_portal = {"Authorization": f"token {service_token(platform, 'portal')}"}
    assert requests.get(f"{hub}/users", headers=as_portal, timeout=10).status_code == 200
    assert requests.post(f"{hub}/users/cal/server", json={}, headers=as_portal, timeout=10).status_code == 403
    assert requests.delete(f"{hub}/users/ann/server", headers=as_portal, timeout=10).status_code == 403
    # It reads the whole line, as it reads every user's servers (the portal narrows both to each
    # reader, portal/data/access.py), and may change nothing in it.
    assert requests.get(f"{hub}/gpuslice/line", headers=as_portal, timeout=10).status_code == 200
    cancel = {"action": "cancel", "user": "ann", "server": ""}
    changed = requests.post(f"{hub}/gpuslice/line", json=cancel, headers=as_portal, timeout=10)
    assert changed.status_code == 403, changed.text
    assert ann.api("GET", "/users/ann").json()["servers"][""]["ready"]

    # An admin: everything.
    assert admin.api("GET", "/users").status_code == 200
    assert admin.api("DELETE", "/users/ann/server").status_code in (202, 204)

    # Not in any class and signup closed: no account.
    stranger = Session(platform.url)
    stranger.get(f"{platform.url}/hub/login")
    response = stranger.post(
        f"{platform.url}/hub/login",
        data={"username": "mallory", "password": "a-long-password", "_xsrf": stranger.xsrf()},
        allow_redirects=False,
    )
    assert response.status_code == 403, response.status_code
    assert "mallory" not in [u["name"] for u in admin.api("GET", "/users").json()]


def service_token(platform: Platform, service: str) -> str:
    """The API token the hub gave a managed service of this platform, read from its 0600 file as the
    platform's account can (never from the service's environment: spawner/secretenv.py)."""
    return (platform.data_dir / f"{service}-hub-token").read_text().strip()
