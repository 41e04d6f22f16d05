"""Build what the suite's container tests need before they ask, so that no test worker waits on a build.

``scripts/test`` starts this beside the whole suite (its log: test-artifacts/prepare.log). The chart's
test, z2jh's hub, KubeSpawner's suite and the installed service each build their images when they
first need them (tests/kube/images.py); built here first, they find them made (each build holds its
image's lock, so a test that asks meanwhile waits for this build instead of starting its own). A
build mostly waits on Debian's and PyPI's downloads, so done here it leaves the test workers' cores
to the tests: the chart's test alone spent ~6 minutes of a worker waiting on its builds.

Nothing here is needed for correctness: where it fails (no podman, no network), the tests build
what they need themselves and report the failure there.

Run ``python -m tests.kube.prepare`` (each part's time is printed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tests.kube import images, kubespawner_suite


def _timed(name: str, make: Callable[[], object]) -> str:
    began = time.monotonic()
    try:
        make()
    except Exception as exc:  # the test that needs it builds it again and reports the failure
        return f"{name}: failed after {time.monotonic() - began:.0f} s: {str(exc)[-2000:]}"
    return f"{name}: {time.monotonic() - began:.0f} s"


def _group(names: tuple[str, ...]) -> list[str]:
    return [_timed(name, lambda name=name: images.build(name)) for name in names]


def prepare() -> list[str]:
    """Every image the container tests build and KubeSpawner's suite's virtualenv; a line per part."""
    if images.missing_tools():
        return [f"nothing prepared: missing {', '.join(images.missing_tools())} (scripts/setup installs them)"]
    lines = [_timed("debian base", images.debian_base)]
    groups = [*images.BUILT_TOGETHER, ("machine",)]  # the machine: tests/e2e/test_service.py
    with ThreadPoolExecutor(max_workers=len(groups) + 1, thread_name_prefix="prepare") as pool:
        venv = pool.submit(_timed, "kubespawner suite's virtualenv", kubespawner_suite.suite_python)
        for built in pool.map(_group, groups):
            lines += built
        # The stand-ins build on the notebook and proxy images, made above.
        lines.append(_timed("kubespawner suite's stand-in images", kubespawner_suite.stand_in_images))
        lines.append(venv.result())
    return lines


def main() -> None:
    started = time.monotonic()
    for line in prepare():
        print(line, flush=True)
    print(f"all: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
