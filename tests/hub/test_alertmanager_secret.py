"""The Alertmanager config written into its Secret over the Kubernetes REST API (hub/alertmanager_secret.py).

A small HTTP server speaks the two calls as the API server does (GET, PUT with resourceVersion:
an older one is a 409 Conflict; a missing Secret a 404). tests/kube/apiserver.py has no PUT yet.
"""

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import requests

from hub.alertmanager_secret import Kube, SecretWriteError, write_config
from spawner.ports import free_port

pytestmark = pytest.mark.process  # a real HTTP server on a loopback port
PATH = "/api/v1/namespaces/monitoring/secrets/gs-alertmanager"


class Api:
    def __init__(self) -> None:
        self.secret: dict[str, Any] | None = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gs-alertmanager", "namespace": "monitoring", "resourceVersion": "7"},
            "data": {"other.tmpl": base64.b64encode(b"{{ define }}").decode()},
        }
        self.puts = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                payload = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path != PATH or api.secret is None:
                    self._answer(404, {"kind": "Status", "reason": "NotFound", "code": 404})
                else:
                    self._answer(200, api.secret)

            def do_PUT(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert api.secret is not None
                if body["metadata"].get("resourceVersion") != api.secret["metadata"]["resourceVersion"]:
                    self._answer(409, {"kind": "Status", "reason": "Conflict", "code": 409})
                    return
                body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
                api.secret, api.puts = body, api.puts + 1
                self._answer(200, body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.kube = Kube(f"http://127.0.0.1:{self.server.server_port}", requests.Session())


@pytest.fixture
def api() -> Iterator[Api]:
    running = Api()
    yield running
    running.server.shutdown()


def test_the_config_lands_under_its_key_and_the_other_keys_stay(api: Api) -> None:
    assert write_config(api.kube, "monitoring", "gs-alertmanager", "alertmanager.yaml", "route: {}\n")
    assert api.secret is not None
    assert base64.b64decode(api.secret["data"]["alertmanager.yaml"]) == b"route: {}\n"
    assert "other.tmpl" in api.secret["data"]
    assert not write_config(api.kube, "monitoring", "gs-alertmanager", "alertmanager.yaml", "route: {}\n")
    assert api.puts == 1  # the same config again: nothing written


def test_a_missing_secret_says_how_to_create_it(api: Api) -> None:
    api.secret = None
    with pytest.raises(SecretWriteError, match="kubectl -n monitoring create secret generic gs-alertmanager"):
        write_config(api.kube, "monitoring", "gs-alertmanager", "alertmanager.yaml", "route: {}\n")
