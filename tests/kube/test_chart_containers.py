"""The chart as people install it: real images built with podman, the rendered chart run as
containers against the Kubernetes API double (TLS, the chart's RBAC), a slice spawned through
the proxy container into a notebook container, the hub killed and restarted, an upgrade.

Needs podman, runc, aardvark-dns and mmdebstrap (scripts/setup installs them as root); the
first run builds the images (a few minutes), later runs find them by the hash of their inputs.
docs/kubernetes.md ("The chart as containers") says what this proves and what it does not.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.kube.conftest import gpushare_node, login
from tests.kube.containers import Cluster, keep_generated_secrets, render, rule_groups
from tests.kube.images import build_platform, missing_tools

pytestmark = pytest.mark.e2e
RELEASE = "gs-gpuslice"
HUB, PROXY, PORTAL = f"{RELEASE}-hub", f"{RELEASE}-proxy", f"{RELEASE}-portal"
EXPORTER, PROMETHEUS = f"{RELEASE}-exporter", "prometheus"  # the exporters' headless Service; Prometheus's name
GiB = 2**30
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "chart-containers"


def chart_values(images: dict[str, str], idle_timeout: int = 3600) -> dict[str, Any]:
    def image(tag: str) -> dict[str, str]:
        repository, version = tag.rsplit(":", 1)
        return {"repository": repository, "tag": version, "pullPolicy": "Never"}

    return {
        "images": {
            "hub": image(images["hub"]),
            "portal": image(images["portal"]),
            "exporter": image(images["exporter"]),
            "proxy": image(images["proxy"]),
            "notebook": image(images["notebook-base"]),
        },
        "gpuSharing": {"backend": "gpushare"},
        "adminUsers": ["teacher"],
        "groups": {"ml101": {"members": ["alice"], "maxSlice": "8GiB", "budget": "40GiB"}},
        "hub": {"idleTimeout": idle_timeout, "singleuser": {"startTimeout": 120}},
        # The harness's Prometheus, on the network; operator: the PrometheusRule it loads (as the operator would).
        "monitoring": {"prometheusUrl": f"http://{PROMETHEUS}:9090", "operator": True},
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if missing_tools():
        message = f"podman harness: missing {', '.join(missing_tools())} (scripts/setup installs them as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    started = time.monotonic()
    images = build_platform()
    built = time.monotonic()
    root = tmp_path
    cluster = Cluster(root, [gpushare_node("gpu-a", 1, 15), gpushare_node("gpu-b", 1, 15)], images=images)
    docs = render(chart_values(images), root)
    cluster.docs = docs
    try:
        cluster.create_network()
        cluster.start_api()
        cluster.apply(docs, publish={PROXY: [8000]})
        cluster.start_prometheus(EXPORTER, 9400, name=PROMETHEUS, rule_groups=rule_groups(docs))
        cluster.wait_for(f"{cluster.url(PROXY, 8000)}/hub/health", timeout_s=180)
        print(f"\nharness: images {built - started:.0f} s, chart up {time.monotonic() - built:.0f} s")
        yield cluster
    except BaseException:
        for name in cluster.containers:
            print(f"--- {name}\n{cluster.logs(name)}")
        raise
    finally:
        cluster.stop()


def refused_login(base: str, user: str, password: str) -> str:
    """The login page's answer to a login that must fail (its error words)."""
    session = requests.Session()
    form = session.get(f"{base}/hub/login", timeout=30)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
    data = {"username": user, "password": password, **({"_xsrf": xsrf.group(1)} if xsrf else {})}
    answer = session.post(f"{base}/hub/login", data=data, timeout=60, allow_redirects=False)
    assert answer.status_code != 302, f"{user} was logged in with a stranger's password"
    return answer.text


def invite_in_the_hub(cluster: Cluster, user: str) -> str:
    """`gpuslice user invite USER` run in the hub's container (kubectl exec): it reads the chart's values
    from the container's environment, as the hub does; the code is printed once, as USER,CODE."""
    from tests.kube.images import podman

    printed = podman("exec", cluster.containers[HUB], "gpuslice", "user", "invite", user).stdout
    codes = dict(line.split(",", 1) for line in printed.splitlines() if line.startswith(f"{user},"))
    assert user in codes, printed
    return codes[user]


def join(base: str, user: str, code: str, password: str) -> requests.Response:
    """A member at /hub/join, through the proxy: their name, the invite code and the password they choose."""
    session = requests.Session()
    page = session.get(f"{base}/hub/join", timeout=30)
    assert page.status_code == 200, page.text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    form = {"username": user, "code": code, "password": password, "password2": password}
    return session.post(
        f"{base}/hub/join",
        data={**form, **({"_xsrf": xsrf.group(1)} if xsrf else {})},
        timeout=60,
        allow_redirects=False,
    )


def refused_join(base: str, user: str, code: str) -> str:
    answer = join(base, user, code, "a-strangers-password")
    assert answer.status_code == 403, f"HTTP {answer.status_code}: {answer.text[:500]}"
    return answer.text


def api_token(base: str, session: requests.Session, user: str) -> str:
    xsrf = session.cookies.get("_xsrf", path="/hub/") or session.cookies.get("_xsrf") or ""
    made = session.post(
        f"{base}/hub/api/users/{user}/tokens",
        json={"note": "harness", "expires_in": 3600},
        headers={"X-XSRFToken": xsrf, "Referer": f"{base}/hub/"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def wait_ready(base: str, token: str, user: str, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = requests.get(f"{base}/hub/api/users/{user}", headers={"Authorization": f"token {token}"}, timeout=30)
        server = got.json()["servers"].get("") if got.status_code == 200 else None
        if server and server.get("ready"):
            return dict(server)
        time.sleep(1)
    raise AssertionError(f"{user}'s server not ready in {timeout_s:.0f} s")


def test_the_rendered_chart_spawns_a_slice_survives_a_hub_restart_and_an_upgrade(cluster: Cluster) -> None:
    base = cluster.url(PROXY, 8000)
    admin_password = cluster.secret_value(HUB, "admin-password")
    admin = login(base, "teacher", admin_password)
    token = api_token(base, admin, "teacher")
    headers = {"Authorization": f"token {token}"}

    # alice is a class member in the chart's values: a stranger who types her name first is refused
    # (open sign-up covers only names nobody knows); she joins at /hub/join with the invite code an
    # admin made in the hub's container, as `kubectl exec deploy/gs-gpuslice-hub -- gpuslice user invite`.
    refused = refused_login(base, "alice", "a-strangers-guess")
    assert "cannot be claimed" in refused, refused
    code = invite_in_the_hub(cluster, "alice")
    joined = join(base, "alice", code, "alices-own-password")
    assert joined.status_code == 302 and joined.headers["Location"].endswith("/hub/spawn"), joined.text
    assert "does not open this name" in refused_join(base, "alice", code)  # the code worked once

    # alice logs in in Chromium through the proxy container, asks for a 4 GiB slice on the
    # spawn form, reaches JupyterLab in her notebook container and runs a cell.
    output = spawn_and_run_a_cell(base, token, cluster.url(PROMETHEUS, 9090))
    assert f"slice {4 * GiB}" in output, output
    pod = cluster.k8s("/api/v1/namespaces/jupyter/pods/jupyter-alice")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
    assert pod["spec"]["containers"][0]["image"] == cluster.images["notebook-base"]
    assert notebook_env(cluster, "jupyter-alice")["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    # Her JupyterLab carries the GPU line's notice, and the hub serves it the warnings (none now).
    assert "@gpuslice/reclaim-notice" in notebook_labextensions(cluster, "jupyter-alice")
    # And its jupyter_server counts only use as activity: the config is where it looks and takes hold.
    assert notebook_env(cluster, "jupyter-alice")["JUPYTER_CONFIG_PATH"] == "/opt/gpuslice/lab"
    assert notebook_counts_only_use(cluster, "jupyter-alice")
    notices = admin.get(f"{base}/hub/gpuslice/notice", timeout=30)
    assert notices.status_code == 200 and notices.json()["notices"] == [], notices.text
    assert_rules_loaded(cluster.url(PROMETHEUS, 9090), rule_groups(cluster.docs))

    # The API double checks the token and the RBAC the chart grants: the portal's account reads only.
    intruder = {"metadata": {"name": "intruder"}, "spec": {"containers": []}}
    refused = requests.post(
        f"https://{cluster.gateway}:{cluster.api_port}/api/v1/namespaces/jupyter/pods",
        json=intruder,
        headers={"Authorization": f"Bearer {cluster.tokens[PORTAL]}"},
        verify=str(cluster.ca),
        timeout=10,
    )
    assert refused.status_code == 403, refused.text

    # The hub container dies; its restart policy brings it back on the same claim.
    cluster.kill(HUB)
    time.sleep(3)
    cluster.wait_for(f"{base}/hub/health", timeout_s=120)
    assert cluster.restarts.get(cluster.containers[HUB]), "the hub answered without having restarted"
    server = wait_ready(base, token, "alice", timeout_s=120)
    assert server["ready"]
    assert requests.get(f"{base}/user/alice/api/status", headers=headers, timeout=60).status_code == 200
    assert cluster.k8s("/api/v1/namespaces/jupyter/pods/jupyter-alice")["status"]["phase"] == "Running"
    login(base, "teacher", admin_password)  # the admin's password still works
    with pytest.raises(AssertionError):
        login(base, "alice", "someone-elses-guess")  # and alice's account is still hers

    # An upgrade: re-rendered with a changed value (generated secrets kept, as lookup does), rolled.
    installed = cluster.docs
    upgraded = render(chart_values(cluster.images, idle_timeout=7200), cluster.root)
    keep_generated_secrets(upgraded, installed)
    cluster.apply(upgraded, publish={PROXY: [8000]})
    cluster.wait_for(f"{base}/hub/health", timeout_s=180)
    relogged = login(base, "teacher", admin_password)
    users = requests.get(
        f"{base}/hub/api/users", headers={"Authorization": f"token {api_token(base, relogged, 'teacher')}"}, timeout=30
    )
    assert {"teacher", "alice"} <= {u["name"] for u in users.json()}  # the database remains
    login(base, "alice", "alices-own-password")  # and the password store


CELL = 'import os; print("slice", os.environ["GPUSLICE_GPU_MEMORY_BYTES"])'
NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": CELL}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def spawn_and_run_a_cell(base: str, token: str, prometheus: str) -> str:
    """alice's slice from the spawn form, the output of a cell run in her JupyterLab, her server on Jobs,
    her GPU with her slice and its readings on GPUs."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.browser import ARGS, CHROMIUM, log_in

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "alice", "alices-own-password")
            page.goto(f"{base}/hub/spawn")
            page.select_option("#gpu", "4GiB")
            page.click(".feedback-container button[type=submit]")  # JupyterHub's Start
            page.wait_for_url("**/user/alice/lab**", timeout=180_000)
            written = requests.put(
                f"{base}/user/alice/api/contents/slice.ipynb",
                json={"type": "notebook", "format": "json", "content": NOTEBOOK},
                headers={"Authorization": f"token {token}"},
                timeout=30,
            )
            assert written.status_code in (200, 201), written.text
            page.goto(f"{base}/user/alice/lab/tree/slice.ipynb")
            try:
                page.wait_for_selector("text=| Idle", timeout=120_000)  # the kernel, in the status bar
                page.click(".jp-Notebook .jp-Cell .jp-InputArea-editor", timeout=60_000)
                page.keyboard.press("Shift+Enter")
                page.wait_for_selector(".jp-OutputArea-output >> text=slice", timeout=120_000)
            except Exception as exc:
                raise page_failure(page, "jupyterlab") from exc
            output = page.inner_text(".jp-OutputArea-output")
            # The portal container (through the proxy, its OAuth gate) lists her running server on
            # Servers: it read the hub's API and the pods through its own service account.
            page.goto(f"{base}/services/portal/servers")
            try:
                page.wait_for_selector("h1:has-text('Servers')", timeout=60_000)
                page.wait_for_selector("text=1 running", timeout=60_000)
                page.wait_for_selector("text=alice", state="attached", timeout=120_000)
            except Exception as exc:
                raise page_failure(page, "portal-jobs") from exc
            # GPUs: the card alice's pod holds, with her slice (the pods' annotations) and the exporter's
            # readings from the Prometheus the chart names (monitoring.prometheusUrl).
            wait_for_readings(prometheus, nodes=2)
            # Wide enough for every column: the table draws (and puts in the DOM) only the visible ones.
            page.set_viewport_size({"width": 2200, "height": 900})
            page.goto(f"{base}/services/portal/gpus")
            try:
                page.wait_for_selector("h1:has-text('GPUs')", timeout=60_000)
                row = page.locator("tr", has_text="alice 4 GiB")
                row.wait_for(state="attached", timeout=60_000)
                assert re.search(r"\d+ C", row.inner_text()), row.inner_text()  # a temperature, not n/a
                assert page.get_by_text("Live readings are unavailable").count() == 0
            except Exception as exc:
                raise page_failure(page, "portal-gpus") from exc
            return output
        finally:
            browser.close()


def page_failure(page: Any, name: str) -> AssertionError:
    """A failed step: its screenshot under test-artifacts and what the page said, in the error itself
    (CI keeps only the test's output)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    text = " ".join(page.inner_text("body").split())
    return AssertionError(f"{name} at {page.url} said: {text[:3000]}")


def wait_for_readings(prometheus: str, nodes: int, timeout_s: float = 60) -> None:
    """Prometheus has scraped every node's exporter (the GPUs page reads DCGM_FI_DEV_GPU_TEMP by node)."""
    deadline = time.monotonic() + timeout_s
    found: set[str] = set()
    while time.monotonic() < deadline:
        answer = requests.get(f"{prometheus}/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_TEMP"}, timeout=10)
        found = {series["metric"].get("Hostname", "") for series in answer.json()["data"]["result"]}
        if len(found) >= nodes:
            return
        time.sleep(1)
    raise AssertionError(f"Prometheus scraped the exporters of {sorted(found)} only in {timeout_s:.0f} s")


def assert_rules_loaded(prometheus: str, groups: list[dict[str, Any]], timeout_s: float = 30) -> None:
    """Prometheus's rules API lists every group and rule of the chart's PrometheusRule, each evaluated
    without error (a rule that does not parse stops the file loading; one that fails at evaluation is 'err')."""
    expected = {g["name"]: [r.get("alert") or r.get("record") for r in g["rules"]] for g in groups}
    assert expected, "the chart rendered no PrometheusRule (monitoring.operator)"
    deadline = time.monotonic() + timeout_s
    while True:
        loaded = requests.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        found = {g["name"]: [r["name"] for r in g["rules"]] for g in loaded}
        health = {r["name"]: (r["health"], r.get("lastError", "")) for g in loaded for r in g["rules"]}
        if found == expected and all(state != "unknown" for state, _ in health.values()):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus loaded {found}, not {expected}")
        time.sleep(1)
    failed = {name: error for name, (state, error) in health.items() if state != "ok"}
    assert not failed, failed


def notebook_labextensions(cluster: Cluster, pod: str) -> str:
    """What `jupyter labextension list` says in the notebook container (it writes to stderr)."""
    from tests.kube.images import podman

    listed = podman("exec", f"{cluster.network}-pod-jupyter-{pod}", "jupyter", "labextension", "list")
    return listed.stdout + listed.stderr


def notebook_counts_only_use(cluster: Cluster, pod: str) -> bool:
    """Whether the notebook container's jupyter_server takes spawner/lab/jupyter_server_config.py's hook."""
    from tests.kube.images import podman

    check = "import runpy; print(runpy.run_path('/opt/gpuslice/lab/jupyter_server_config.py')['count_only_changes']())"
    ran = podman("exec", f"{cluster.network}-pod-jupyter-{pod}", "python3", "-c", check)
    return ran.stdout.strip() == "True"


def notebook_env(cluster: Cluster, pod: str) -> dict[str, str]:
    """The environment of the notebook container's main process (what its kernels inherit)."""
    from tests.kube.images import podman

    name = f"{cluster.network}-pod-jupyter-{pod}"
    found = podman("exec", name, "cat", "/proc/1/environ")
    pairs = (item.split("=", 1) for item in found.stdout.split("\0") if "=" in item)
    return dict(pairs)
