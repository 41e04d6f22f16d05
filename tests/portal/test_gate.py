import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.e2e.platform import free_port


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_stopping_or_killing_the_gate_stops_its_streamlit(signum: int) -> None:
    gate_port, streamlit_port = free_port(), free_port()
    env = dict(
        os.environ,
        JUPYTERHUB_SERVICE_PREFIX="/services/portal/",
        JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{gate_port}",
        JUPYTERHUB_API_URL="http://127.0.0.1:9/hub/api",
        JUPYTERHUB_API_TOKEN="unused",
        JUPYTERHUB_CLIENT_ID="service-portal",
        GPUSLICE_STREAMLIT_PORT=str(streamlit_port),
    )
    gate = subprocess.Popen([sys.executable, "-m", "portal.gate"], env=env)
    try:
        deadline = time.monotonic() + 60
        health = f"http://127.0.0.1:{gate_port}/services/portal/_stcore/health"
        while time.monotonic() < deadline:
            try:
                if requests.get(health, timeout=2).text == "ok":
                    break
            except requests.RequestException:
                pass
            time.sleep(0.3)
        assert listening(streamlit_port), "Streamlit did not start behind the gate"
        gate.send_signal(signum)
        assert gate.wait(timeout=20) is not None
        deadline = time.monotonic() + 15
        while listening(streamlit_port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not listening(streamlit_port), "Streamlit outlived its gate"
    finally:
        gate.kill()
