"""What the start of each of the platform's processes imports. A class of 60 pressing Start together
pays a notebook server's imports 60 times, and every hub restart pays the hub's and its services'; a
module that costs a second of CPU to import where it is never used is a regression (docs/load.md)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# (what starts, the module it must not import, why)
NOT_IMPORTED = [
    ("jupyterhub.app", "rfc3987_syntax", "jsonschema >= 4.24 builds its Lark parsers at import (pyproject.toml)"),
    ("jupyter_server.serverapp", "rfc3987_syntax", "the same, in every notebook server's start"),
    ("hub.reclaimer", "kubernetes_asyncio", "the single-machine reclaimer needs no Kubernetes client"),
    ("hub.job_dispatch", "alembic", "the market is only migrated by gpuslice up and upgrade"),
    ("hub.job_dispatch", "spawner.mixin", "jobs are placed with the line and the ledger, not the spawner"),
    ("hub.platform", "jupyterhub", "gpuslice up starts the hub; the password stores it fills need no JupyterHub"),
    ("hub.platform", "spawner.mixin", "gpuslice up copies the kernel hook and lab files, it runs no spawner"),
    ("hub.settings", "numpy", "every service and command reads the settings; only placing needs numpy"),
]


@pytest.mark.parametrize(("module", "unwanted", "why"), NOT_IMPORTED, ids=[f"{m}-{u}" for m, u, _ in NOT_IMPORTED])
def test_a_start_does_not_import_what_it_does_not_use(module: str, unwanted: str, why: str) -> None:
    probe = (
        f"import sys, {module}; "
        f"print(sorted(m for m in sys.modules if m == {unwanted!r} or m.startswith({unwanted + '.'!r}))[:3])"
    )
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert imported.stdout.strip() == "[]", f"importing {module} imports {imported.stdout.strip()}: {why}"
