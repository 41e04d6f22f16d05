"""KubeSpawner's own test suite, run unmodified against the Kubernetes API double.

The suite (``../shared/vendor/kubespawner-7.1.0/tests``, KubeSpawner's ``tests/`` at its tag)
is what KubeSpawner's maintainers run against a real cluster (k3s): a hub pod, single-user
pods started by KubeSpawner, ``exec`` into pods to reach them, namespaces made and deleted,
Services and Secrets left to ownerReference garbage collection. Here it runs in a pytest of
its own (a subprocess, so that its fixtures, event loop and plugins are its own and its
results are its own report, read back from its JUnit XML) in a virtualenv of its own
(``kubespawner-suite.txt``: KubeSpawner, JupyterHub and kubernetes_asyncio at the hub
image's versions), pointed at the double by a kubeconfig, the double's kubelet running pods
as podman containers (``tests/kube/kubelet.py``).

The one shim, the images: the suite's pods name images a cluster pulls from public registries,
which cannot be pulled here. The double's kubelet runs, in their place, images built here
from the project's own (``STAND_INS``): each provides what the suite uses of the image it
stands for, said beside it.

Run ``python -m tests.kube.kubespawner_suite`` for the figures (passed, failed, skipped).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.platform import free_port
from tests.kube.images import ULIMITS, build, building, podman

REPO = Path(__file__).parents[2]
VENDOR_NAME = "vendor/kubespawner-7.1.0"
REQUIREMENTS = Path(__file__).with_name("kubespawner-suite.txt")
CONSTRAINTS = REPO / "images" / "constraints.txt"
VENV = REPO / ".venv" / "kubespawner-suite"

# The images the suite's pods name, and what stands for each here. {notebook}: the project's CPU
# notebook image (images/notebook-base on Debian: JupyterHub's single-user server at the version
# images/constraints.txt pins, jupyterlab, uid 1000, tini); {proxy}: images/proxy (Node.js and
# configurable-http-proxy). Each Containerfile is built on those.
STAND_INS = {
    # KubeSpawner's default image: jupyterhub-singleuser as user jovyan (1000). The notebook image is that.
    "quay.io/jupyterhub/singleuser:latest": "FROM {notebook}\n",
    # The hub pod: JupyterHub with configurable-http-proxy, run as root in /srv/jupyterhub (the
    # suite's hub config writes its internal-SSL files into /etc/jupyterhub).
    "quay.io/jupyterhub/jupyterhub:latest": (
        "FROM {notebook}\n"
        "USER root\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends nodejs && rm -rf /var/lib/apt/lists/*\n"
        "COPY --from={proxy} /usr/local/lib/node_modules/configurable-http-proxy"
        " /usr/local/lib/node_modules/configurable-http-proxy\n"
        "RUN ln -s ../lib/node_modules/configurable-http-proxy/bin/configurable-http-proxy"
        " /usr/local/bin/configurable-http-proxy && mkdir -p /srv/jupyterhub\n"
        "WORKDIR /srv/jupyterhub\n"
        'CMD ["jupyterhub"]\n'
    ),
    # The pod the suite execs into: python3 and /bin/sh, as root, no entrypoint.
    "python:3.12-slim": 'FROM {notebook}\nUSER root\nWORKDIR /\nENTRYPOINT []\nCMD ["python3"]\n',
}
NODE = {
    "kind": "Node",
    "apiVersion": "v1",
    "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a", "kubernetes.io/os": "linux"}},
    "status": {
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


@dataclass
class SuiteResult:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test id -> the failure's first line
    skipped: dict[str, str] = field(default_factory=dict)  # test id -> the skip's reason
    seconds: float = 0.0
    output: str = ""
    second_tries: list[str] = field(default_factory=list)  # passed when run again alone (to_run_again)
    order: list[str] = field(default_factory=list)  # every test id, in the order the suite ran them

    def summary(self) -> str:
        again = (
            f" ({len(self.second_tries)} on a second try: {', '.join(self.second_tries)})" if self.second_tries else ""
        )
        return (
            f"{len(self.passed)} passed{again}, {len(self.failed)} failed, {len(self.skipped)} skipped"
            f" in {self.seconds:.0f} s"
        )


def suite_python() -> Path:
    """The suite's virtualenv's python, made (or remade when its requirements change) first."""
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()
    stamp = VENV / ".installed"
    python = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # Held while it is made: the suite's preparation (tests/kube/prepare.py) may be making it meanwhile.
    with (VENV.parent / "kubespawner-suite.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
            install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*install, "-c", str(CONSTRAINTS), "-r", str(REQUIREMENTS)], check=True, timeout=900)
            stamp.write_text(wanted)
    return python


def stand_in_images() -> dict[str, str]:
    """{image the suite names: image built here}, built once per machine (tagged by their inputs' hash)."""
    bases = {"notebook": build("notebook-base"), "proxy": build("proxy")}
    found = {}
    for wanted, recipe in STAND_INS.items():
        text = recipe.format(**bases)
        name = wanted.split("/")[-1].split(":")[0]
        tag = f"localhost/gpuslice-standin-{name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        with building(tag) as missing, tempfile.TemporaryDirectory(prefix="gpuslice-standin-") as folder:
            if missing:
                (Path(folder) / "Containerfile").write_text(text)
                podman("build", "--network=host", *ULIMITS, "--tag", tag, folder, timeout=900)
        found[wanted] = tag
    return found


@contextmanager
def podman_network() -> Iterator[str]:
    name = f"gpuslice-ks-{secrets.token_hex(4)}"
    for _ in range(20):  # a free /24 among those other tests may hold
        third = secrets.randbelow(200) + 20
        if podman("network", "create", "--subnet", f"10.89.{third}.0/24", name, check=False).returncode == 0:
            break
    else:
        raise RuntimeError("no free podman subnet for the suite's pods")
    try:
        yield name
    finally:
        listed = podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"network={name}", check=False)
        for container in listed.stdout.split():
            podman("rm", "--force", "--time", "0", container, check=False)
        podman("network", "rm", "--force", name, check=False)


@contextmanager
def api_double(root: Path, network: str, images: dict[str, str]) -> Iterator[int]:
    """The double with a podman kubelet on network; its port."""
    (root / "nodes.json").write_text(json.dumps([NODE]))
    (root / "images.json").write_text(json.dumps(images))
    port = free_port()
    log = (root / "apiserver.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.kube.apiserver", "--port", str(port), "--nodes", str(root / "nodes.json"),
         "--podman-network", network, "--images", str(root / "images.json")],
        stdout=log, stderr=log, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API double did not start: see {root / 'apiserver.log'}")
            time.sleep(0.2)
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)  # it stops every pod's container first
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(port: int) -> bool:
    import requests

    try:
        return requests.get(f"http://127.0.0.1:{port}/version", timeout=2).ok
    except requests.RequestException:
        return False


def kubeconfig(path: Path, port: int) -> None:
    cluster = {"name": "double", "cluster": {"server": f"http://127.0.0.1:{port}"}}
    context = {"name": "double", "context": {"cluster": "double", "user": "suite"}}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "suite", "user": {"token": "not-checked-by-the-double"}}],
        "contexts": [context],
        "current-context": "double",
    }
    path.write_text(json.dumps(config))


def read_junit(path: Path) -> SuiteResult:
    result = SuiteResult()
    for case in ElementTree.parse(path).iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        result.order.append(test)
        if failure is not None:
            result.failed[test] = (failure.get("message") or "").splitlines()[0][:300] if failure.get("message") else ""
        elif skip is not None:
            result.skipped[test] = skip.get("message") or ""
        else:
            result.passed.append(test)
    return result


# A failure of this kind is a server not answering yet: the suite gives a started server about five seconds
# (three tries of its exec, a second apart), which the stand-in images' servers can exceed on a loaded
# machine. Such a test is run once more, alone. Its pod is left running (the test stopped before its
# ``spawner.stop()``), so a later test of the same user finds it at its first ``poll()`` and fails with
# ``assert False`` (CI saw two such after test_spawn_start_restore_pod_name): every failure after the first
# slow one is run once more too, in a fresh session whose namespaces are new. A failure before it is not.
NOT_ANSWERING_YET = re.compile(r"TimeoutError: pod .* did not start|ExecError: def check_up|Connection refused")


def to_run_again(result: SuiteResult) -> list[str]:
    """The failed tests to run once more: the slow ones, and every failure after the first slow one."""
    failed_in_order = [t for t in result.order if t in result.failed]
    slow = [i for i, t in enumerate(failed_in_order) if NOT_ANSWERING_YET.search(result.failed[t])]
    return failed_in_order[slow[0] :] if slow else []


def run(vendor: Path, root: Path, timeout_s: float = 1500) -> SuiteResult:
    """The suite against a fresh double; its JUnit report read back. A test whose server did not answer in
    time is run once more (``to_run_again``); the summary counts those second tries."""
    python = suite_python()
    images = stand_in_images()
    started = time.monotonic()
    with podman_network() as network, api_double(root, network, images) as port:
        kubeconfig(root / "kubeconfig", port)
        env = {**os.environ, "KUBECONFIG": str(root / "kubeconfig"), "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("PYTEST_CURRENT_TEST", None)
        result, output = _pytest(python, vendor, root, env, [str(vendor / "tests")], "junit.xml", timeout_s)
        slow = to_run_again(result)
        if slow:
            ids = [str(vendor / "tests" / f"{t.split('::')[0]}.py") + "::" + t.split("::", 1)[1] for t in slow]
            again, more = _pytest(python, vendor, root, env, ids, "junit-again.xml", timeout_s)
            output += f"\n--- run again, alone: {', '.join(slow)}\n{more}"
            for test in again.passed:
                del result.failed[test]
                result.passed.append(test)
                result.second_tries.append(test)
    result.seconds = time.monotonic() - started
    result.output = output
    (root / "suite.log").write_text(result.output)
    return result


def _pytest(
    python: Path, vendor: Path, root: Path, env: dict[str, str], tests: list[str], report_name: str, timeout_s: float
) -> tuple[SuiteResult, str]:
    report = root / report_name
    command = [
        str(python), "-m", "pytest", "-p", "no:cacheprovider", "-c", str(vendor / "pyproject.toml"),
        "--rootdir", str(vendor), "--junitxml", str(report), "--color=no", "-o", "junit_family=xunit1", *tests,
    ]  # fmt: skip
    finished = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    if not report.exists():
        raise RuntimeError(f"the suite wrote no report:\n{finished.stdout[-5000:]}\n{finished.stderr[-3000:]}")
    return read_junit(report), finished.stdout + finished.stderr


def main() -> None:
    from tests.shared import SHARED

    root = Path(tempfile.mkdtemp(prefix="gpuslice-kubespawner-suite-"))
    result = run(SHARED / VENDOR_NAME, root)
    print(result.summary())
    for test, message in {**result.failed, **result.skipped}.items():
        print(f"  {test}: {message}")
    print(f"logs: {root}")


if __name__ == "__main__":
    main()
