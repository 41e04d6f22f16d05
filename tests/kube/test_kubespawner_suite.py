"""KubeSpawner 7.1.0's own test suite passes against the Kubernetes API double.

The suite is the conformance test of the double: what KubeSpawner's maintainers check against
a real cluster, unmodified, with the double's kubelet running its pods as podman containers
(tests/kube/kubespawner_suite.py says how, and its one shim: the images). Every test must
pass; a test that cannot is listed in KNOWN with the reason a real cluster differs, and a
listed test that passes fails this test (the list stays true). docs/kubernetes.md has the
figures.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.kube.images import missing_tools
from tests.kube.kubespawner_suite import CONSTRAINTS, VENDOR_NAME, run
from tests.shared import shared_file

pytestmark = pytest.mark.e2e
# test id -> why it cannot pass (fails or skips) against the double, as a real cluster differs (empty: all pass).
KNOWN: dict[str, str] = {}
# Tests whose result against the double is not settled yet: either result is allowed, and said. Not a
# difference of real clusters (that would be KNOWN): a defect of the double or of its stand-in images
# that is still being found.
UNSETTLED: dict[str, str] = {}


def vendored_suite() -> Path:
    return shared_file(f"{VENDOR_NAME}/tests").parent


def test_the_vendored_suite_is_the_kubespawner_the_images_ship() -> None:
    vendor = vendored_suite()
    suite_version = re.search(r'current = "([^"]+)"', (vendor / "pyproject.toml").read_text())
    pinned = re.search(r"^jupyterhub-kubespawner==(\S+)$", CONSTRAINTS.read_text(), re.MULTILINE)
    assert suite_version and pinned and suite_version.group(1) == pinned.group(1)


def test_kubespawners_own_suite_passes_against_the_double(tmp_path: Path) -> None:
    vendor = vendored_suite()
    if missing_tools():
        message = (
            f"the suite's pods run under podman: missing {', '.join(missing_tools())} (scripts/setup installs them)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    result = run(vendor, tmp_path)
    print(result.summary())
    for test, why in UNSETTLED.items():
        print(f"unsettled: {test} {'passed' if test in result.passed else 'did not pass'} ({why})")
    unexpected = {t: m for t, m in {**result.failed, **result.skipped}.items() if t not in KNOWN and t not in UNSETTLED}
    assert not unexpected, f"{result.summary()}; not passed: {unexpected}; see {tmp_path / 'suite.log'}"
    passed_anyway = set(KNOWN) & set(result.passed)
    assert not passed_anyway, f"listed in KNOWN but passed (take them off the list): {passed_anyway}"
    total = len(result.passed) + len(result.failed) + len(result.skipped)
    assert total == 207, result.summary()  # the suite's 207 tests, every one collected
