import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from tornado import httpclient, web

from portal.gate import Upstream
from portal.gate import make_app as gate_app
from tests.e2e.platform import free_port

pytestmark = pytest.mark.process  # starts processes: not in the fast tier


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


def test_the_gate_forwards_many_requests_at_once() -> None:
    """A class opening the portal together: every browser request reaches Streamlit at once.

    Tornado's shared client forwards 10 at a time and fails what waits over 20 s in its queue;
    here Streamlit (a stand-in that answers only once ``wanted`` requests are in) would see 10.
    """
    wanted = 40

    async def scenario() -> int:
        arrived = asyncio.Event()
        in_flight = 0
        most = 0

        class Slow(web.RequestHandler):
            async def get(self) -> None:
                nonlocal in_flight, most
                in_flight += 1
                most = max(most, in_flight)
                if most >= wanted:
                    arrived.set()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(arrived.wait(), timeout=3)
                in_flight -= 1
                self.write("ok")

        upstream_port, gate_port = free_port(), free_port()
        streamlit = web.Application([(r".*", Slow)]).listen(upstream_port, address="127.0.0.1")
        gate = gate_app("/services/portal/", Upstream(upstream_port, b"k" * 32), b"c" * 32).listen(
            gate_port, address="127.0.0.1"
        )
        browsers = httpclient.AsyncHTTPClient(force_instance=True, max_clients=wanted)
        health = f"http://127.0.0.1:{gate_port}/services/portal/_stcore/health"
        try:
            answers = await asyncio.gather(*(browsers.fetch(health, raise_error=False) for _ in range(wanted)))
        finally:
            browsers.close()
            gate.stop()
            streamlit.stop()
        assert [a.code for a in answers] == [200] * wanted
        return most

    assert asyncio.run(scenario()) == wanted
