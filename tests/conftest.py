"""Suite-wide setup that must happen before any test module is imported."""

import json
import os
import tempfile
from pathlib import Path

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


# Markers by where a test lives, so a developer can run a fast subset:
#   scripts/test -m "not e2e and not browser"
# (the README's plain `scripts/test` still runs everything).
_MARK_BY_FOLDER = {"e2e": "e2e", "kube": "kube", "bench": "bench"}
_BROWSER_MODULES: dict[Path, bool] = {}


def _drives_a_browser(path: Path) -> bool:
    if path not in _BROWSER_MODULES:
        _BROWSER_MODULES[path] = "playwright" in path.read_text()
    return _BROWSER_MODULES[path]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
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


def pytest_configure(config: pytest.Config) -> None:
    # Every process a test starts is ended, and one left running fails the run (tests/leaks.py).
    config.pluginmanager.register(LeakCheck(config), "gpuslice-process-leaks")
