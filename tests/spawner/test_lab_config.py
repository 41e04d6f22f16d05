"""spawner/lab/jupyter_server_config.py on a real jupyter_server: an open page's polls are not use."""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from spawner.assets import LAB_DIR

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

TOKEN = "test-token-for-a-local-server"
# What an open, visible JupyterLab asks its server for every few seconds.
NPM_RAN = "npm-ran"
POLLS = ("/api/kernels", "/api/sessions", "/api/terminals", "/api/kernelspecs", "/api/contents?content=1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def jupyter_server(tmp_path: Path, config_path: str | None, hub: dict[str, str] | None = None) -> Iterator[str]:
    """A real jupyter_server on loopback, with JUPYTER_CONFIG_PATH as the spawner sets it (or none), and
    JupyterHub's variables in ``hub`` (where it reports, where Run as job submits).

    An ``npm`` first on its PATH leaves tmp_path/NPM_RAN behind if run (jupyter-lsp's own search runs it)."""
    port = free_port()
    home = tmp_path / f"home-{port}"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"), JUPYTER_RUNTIME_DIR=str(home / "run"))
    env.update(hub or {})
    # A language server in the server's working folder, which jupyter-lsp's search finds (its
    # /lsp/status names it), and an npm that says whether the search ran it.
    fake_server = home / "node_modules" / "bash-language-server" / "out" / "cli.js"
    fake_server.parent.mkdir(parents=True)
    fake_server.write_text("// never run: only its path is looked for\n")
    npm = home / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(f"#!/bin/sh\ntouch {tmp_path / NPM_RAN}\necho /nonexistent\n")
    npm.chmod(0o755)
    env["PATH"] = f"{npm.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    if config_path is not None:
        env["JUPYTER_CONFIG_PATH"] = config_path
    command = [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser"]
    command += [f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={home}", "--allow-root"]
    server = subprocess.Popen(command, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/api/status", headers=auth(), timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stderr and server.stderr.read()
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def auth() -> dict[str, str]:
    return {"Authorization": f"token {TOKEN}"}


def last_activity(url: str) -> str:
    """What the server reports to the hub (its web app's last_activity; /api/status itself is not counted)."""
    return str(requests.get(f"{url}/api/status", headers=auth(), timeout=10).json()["last_activity"])


def language_servers_found(url: str) -> set[str]:
    answer = requests.get(f"{url}/lsp/status", headers=auth(), timeout=10)
    assert answer.ok, answer.text
    return set(answer.json()["specs"])


def poll_like_an_open_page(url: str) -> None:
    for path in POLLS:
        assert requests.get(f"{url}{path}", headers=auth(), timeout=10).ok, path
    # JupyterLab saves its layout every ten seconds or so while a notebook is open.
    layout = {"data": {"layout-restorer:data": {}}, "metadata": {"id": "default"}}
    saved = requests.put(f"{url}/lab/api/workspaces/default", headers=auth(), json=layout, timeout=10)
    assert saved.status_code == 204, saved.text


def test_with_the_platforms_config_an_open_pages_polls_are_not_use_and_a_save_is(tmp_path: Path) -> None:
    with jupyter_server(tmp_path, str(LAB_DIR)) as url:
        assert "bash-language-server" in language_servers_found(url)  # searched, nearby:
        assert not (tmp_path / NPM_RAN).exists()  # without running npm (the control below does)
        before = last_activity(url)
        time.sleep(1.1)  # timestamps differ by more than their resolution
        poll_like_an_open_page(url)
        assert last_activity(url) == before
        saved = requests.put(
            f"{url}/api/contents/notes.txt",
            headers=auth(),
            json={"type": "file", "format": "text", "content": "still here"},
            timeout=10,
        )
        assert saved.status_code == 201, saved.text
        assert last_activity(url) > before


def test_without_it_jupyter_server_counts_every_poll_as_use(tmp_path: Path) -> None:
    """The control: what made a server left open on a screen look busy forever."""
    with jupyter_server(tmp_path, None) as url:
        assert "bash-language-server" in language_servers_found(url)
        assert (tmp_path / NPM_RAN).exists()  # jupyter-lsp's own search asks npm for its global folder
        before = last_activity(url)
        time.sleep(1.1)
        poll_like_an_open_page(url)
        assert last_activity(url) > before


class HubReports(ThreadingHTTPServer):
    """The hub's presence API as a server sees it: each report's path, token and body, in order."""

    def __init__(self) -> None:
        self.reports: queue.Queue[tuple[str, str, dict[str, object]]] = queue.Queue()
        reports = self.reports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reports.put((self.path, self.headers.get("Authorization", ""), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def next_report(self, timeout_s: float = 30) -> tuple[str, str, dict[str, object]]:
        return self.reports.get(timeout=timeout_s)


def test_the_server_reports_its_pages_and_their_input_to_the_hub_and_a_beat_is_not_use(tmp_path: Path) -> None:
    """A page's beats (the lab extension's) reach the hub as the server's report, ages on the server's
    clock, with the server's own token; a beat is not activity (the culler and the idle rule ignore it)."""
    hub = HubReports()
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    variables = {
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.server_address[1]}/hub/api",
        "JUPYTERHUB_API_TOKEN": "server-token",
        "JUPYTERHUB_USER": "ann",
        "JUPYTERHUB_SERVER_NAME": "",
        "JUPYTERHUB_ACTIVITY_INTERVAL": "2",
    }
    try:
        with jupyter_server(tmp_path, str(LAB_DIR), variables) as url:
            path, token, first = hub.next_report()  # at the start: no page, never any input
            assert (path, token) == ("/hub/api/gpuslice/presence/ann/", "token server-token")
            assert first == {"pages": 0, "connections": 0, "busy": False, "input_s": None, "page_s": None}
            before = last_activity(url)
            time.sleep(1.1)
            beat = requests.post(f"{url}/api/gpuslice/presence", headers=auth(), json={"page": "p1", "input": True})
            assert beat.status_code == 200 and beat.json() == {"beat_s": 2.0}, beat.text
            report = hub.next_report()[2]
            while report["pages"] == 0:  # a periodic report may have been on its way
                report = hub.next_report()[2]
            assert report["pages"] == 1 and 0 <= float(report["input_s"]) < 5  # type: ignore[arg-type]
            assert last_activity(url) == before  # input is presence, told apart; not the server's activity
            refused = requests.post(f"{url}/api/gpuslice/presence", headers=auth(), json={"input": True})
            assert refused.status_code == 400 and "page" in refused.text
            anonymous = requests.post(f"{url}/api/gpuslice/presence", json={"page": "p2", "input": True})
            assert anonymous.status_code == 403  # only the server's own pages (its auth) may beat
    finally:
        hub.shutdown()


def test_run_as_job_submits_the_notebook_through_the_hub(tmp_path: Path) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[tuple[str, str, dict[str, object]]] = []

    class Hub(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path.startswith("/hub/api/gpuslice/presence/"):  # the server's own reports, not ours to check
                self.send_response(204)
                self.end_headers()
                return
            asked.append((self.path, self.headers["Authorization"], body))
            answer = json.dumps({"job": {"id": 7, "state": "queued"}}).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    extra = {
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.server_address[1]}/hub/api",
        "JUPYTERHUB_API_TOKEN": "the-servers-own-token",
    }
    try:
        with jupyter_server(tmp_path, str(LAB_DIR), extra) as url:
            assert requests.get(f"{url}/lab", headers=auth(), timeout=30).status_code == 200  # JupyterLab still on
            run = f"{url}/gpuslice/run-as-job"
            assert requests.post(run, json={"path": "a.ipynb"}, timeout=30).status_code == 403  # its owner only
            assert requests.post(run, headers=auth(), json={"notebook": "x"}, timeout=30).status_code == 400
            body = {"path": "work/train.ipynb", "gpu_memory": "4GiB", "time_limit": "1h", "user": "bob"}
            answer = requests.post(run, headers=auth(), json=body, timeout=30)
            assert answer.status_code == 201 and answer.json()["job"]["id"] == 7
    finally:
        hub.shutdown()
    assert asked == [
        (
            "/hub/api/gpuslice/jobs",
            "token the-servers-own-token",
            {
                "notebook": "work/train.ipynb",
                "name": "Run as job: work/train.ipynb",
                "gpu_memory": "4GiB",
                "time_limit": "1h",
            },
        )
    ]  # the dialog's fields only: nothing else of the body (no "user") reaches the hub
