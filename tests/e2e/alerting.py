"""Helpers for tests with the real Prometheus and Alertmanager: a webhook receiver, waiting."""

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from tests.e2e.platform import free_port


class Webhook:
    """Alertmanager's webhook receiver: keeps every alert it is sent."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.received_at: list[datetime] = []  # when each alert arrived
        received, received_at = self.received, self.received_at

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                alerts = json.loads(body)["alerts"]
                received.extend(alerts)
                received_at.extend([datetime.now(UTC)] * len(alerts))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def wait_for(check: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
