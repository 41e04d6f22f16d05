"""Suite-wide setup that must happen before any test module is imported."""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.leaks import LeakCheck

# KubeSpawner needs a kubeconfig even when it makes no API call, and kubernetes_asyncio
# reads $KUBECONFIG once, when it is first imported. Tests that talk to the Kubernetes
# API double write their own and hand it to the hub's environment.
if "KUBECONFIG" not in os.environ:
    _path = Path(tempfile.mkdtemp(prefix="gpuslice-kube-")) / "kubeconfig"
    _path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "none", "user": {"token": "unused"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none", "namespace": "gpuslice"}}],
                "current-context": "none",
            }
        )
    )
    os.environ["KUBECONFIG"] = str(_path)

# joblib (under scikit-learn) counts physical cores by running lscpu, a process the fast tier's
# guard refuses in pure tests; a count given is taken instead (one: the suite runs its own workers).
os.environ.setdefault("LOKY_MAX_CPU_COUNT", "1")  # below the machine's count, or joblib asks lscpu anyway


# Markers by where a test lives, so a developer can run a fast subset:
#   scripts/test -m "not e2e and not browser"
# (the README's plain `scripts/test` still runs everything).
_MARK_BY_FOLDER = {"e2e": "e2e", "kube": "kube", "bench": "bench"}
_BROWSER_MODULES: dict[Path, bool] = {}


def _drives_a_browser(path: Path) -> bool:
    if path not in _BROWSER_MODULES:
        _BROWSER_MODULES[path] = "playwright" in path.read_text()
    return _BROWSER_MODULES[path]


# The modules whose tests take minutes (`scripts/test --durations=40` lists them), run first: spread
# over the workers from the start, they no longer leave one worker busy at the end while the
# others wait (the suite's wall time is the busiest worker's). The two that run the built images
# come after some ten minutes of the others: the whole suite builds the images beside the tests from
# its start (tests/kube/prepare.py, about ten minutes on two busy cores), and first in line the chart's
# test held a worker for six of them waiting on the builds.
_LONGEST_FIRST = (
    "bench/test_classroom.py",
    "e2e/test_local_platform.py",
    "e2e/test_attacker.py",
    "kube/test_chart_containers.py",
    "kube/test_kubespawner_suite.py",
    "bench/test_classday_real.py",
    "e2e/test_monitoring_faults.py",
    "hub/test_cli.py",
    "e2e/test_visual.py",
)


def _longest_first(item: pytest.Item) -> int:
    path = str(item.path)
    return next((i for i, name in enumerate(_LONGEST_FIRST) if path.endswith(name)), len(_LONGEST_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_longest_first)  # stable: the others keep their order
    tests = Path(__file__).parent
    for item in items:
        path = Path(str(item.path))
        folder = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""
        if folder in _MARK_BY_FOLDER:
            item.add_marker(_MARK_BY_FOLDER[folder])
        if _drives_a_browser(path):
            item.add_marker("browser")
        if "benchmark" in item.name:
            item.add_marker("bench")


# A failed test that ran the platform shows the end of its logs (the hub's traceback behind a 500 is
# in its log, not in the test's assertion): in CI's output there is no other copy of them.
_LOGS_SHOWN = ("platform.log", "hub.log", "apiserver.log")
_LOG_LINES = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and isinstance(tmp, Path):
        for log in sorted(f for name in _LOGS_SHOWN for f in tmp.rglob(name))[:3]:
            tail = log.read_text(errors="replace").splitlines()[-_LOG_LINES:]
            report.sections.append((f"last {len(tail)} lines of {log.relative_to(tmp)}", "\n".join(tail)))
    return report


def pytest_configure(config: pytest.Config) -> None:
    # Every process a test starts is ended, and one left running fails the run (tests/leaks.py).
    config.pluginmanager.register(LeakCheck(config), "gpuslice-process-leaks")


# The fast tier (`scripts/test --fast`): pure logic only. A test that starts a process or opens
# a network socket there fails with a message saying to mark it `process`, so the tier stays
# fast by construction rather than by a list someone has to keep up to date.
FAST_TIER = os.environ.get("GPUSLICE_FAST_TIER") == "1"
_NOT_IN_THE_FAST_TIER = (
    "the fast tier runs pure logic only, and this test {what}: mark it "
    "`@pytest.mark.process` (or `pytestmark = pytest.mark.process` for its module)"
)


class _NotPureLogicError(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _pure_logic_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if not FAST_TIER or request.node.get_closest_marker("process"):
        return
    import socket
    import subprocess

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise _NotPureLogicError(_NOT_IN_THE_FAST_TIER.format(what=what))

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("starts a process"))
    monkeypatch.setattr(os, "fork", refuse("forks"))
    monkeypatch.setattr(os, "posix_spawn", refuse("starts a process"))
    for method in ("connect", "connect_ex", "bind"):
        original = getattr(socket.socket, method)

        def guarded(sock: socket.socket, address: Any, *args: Any, _original: Any = original) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                raise _NotPureLogicError(_NOT_IN_THE_FAST_TIER.format(what="opens a network socket"))
            return _original(sock, address, *args)

        monkeypatch.setattr(socket.socket, method, guarded)


# Every page a test opens in Chromium waits for its events as long as the suite's other waits do:
# Playwright's default of 30 s for a navigation or an action fails on a machine running four
# workers on two cores, where a hub or a Streamlit page may take longer to answer. A test that
# names its own timeout keeps it.
PAGE_TIMEOUT_MS = 120_000


@pytest.fixture(autouse=True)
def _patient_browsers(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from playwright.sync_api import Browser
    except ImportError:
        return

    def patient(make: Any) -> Any:
        def made(self: Browser, *args: Any, **kwargs: Any) -> Any:
            context_or_page = make(self, *args, **kwargs)
            context_or_page.set_default_timeout(PAGE_TIMEOUT_MS)
            context_or_page.set_default_navigation_timeout(PAGE_TIMEOUT_MS)
            return context_or_page

        return made

    monkeypatch.setattr(Browser, "new_context", patient(Browser.new_context))
    monkeypatch.setattr(Browser, "new_page", patient(Browser.new_page))
