"""Imports go one way, lowest layer first (docs/architecture.md draws the layers).

Read from the source with ``ast`` (nothing is imported), so a lazy import inside a
function counts as much as one at the top: there is no exception for it. Each module of
ours gets a layer; a module may import its own layer and the layers below it, never one
above. The portal also takes from the hub nothing but the settings model. Between
packages, imports form no cycle (a command above the hub, the benchmarks', registers
itself through an entry point instead of being imported).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sizes", "spawner", "market", "hub", "portal", "bench")

CORE, LOWER, RUNTIME, HUB, PORTAL, BENCH = 1, 2, 3, 4, 5, 6
LAYER_NAMES = {CORE: "pure core", LOWER: "market/ledger/NVML", RUNTIME: "spawner runtime", HUB: "hub", PORTAL: "portal"}
LAYER_NAMES[BENCH] = "bench"

# The most specific prefix wins; a module under no prefix below takes its package's layer.
LAYERS: dict[str, int] = {
    # 1. pure core: no I/O, imports nothing of ours but each other.
    "sizes": CORE,  # amounts of memory ("4GiB"): below the markets and the spawners, which both read them
    "spawner.shares": CORE,
    "spawner.sharing": CORE,  # one module per sharing backend (pods, inventory, extender, form words)
    "spawner.inventory": CORE,
    "spawner.placement": CORE,  # and its split modules (spawner.placement_*, spawner.placement.*)
    "spawner.quotas": CORE,
    "spawner.checked": CORE,  # pydantic models of what people write: unknown keys and values refused clearly
    "spawner.extender": CORE,  # the scheduler extender's decisions (its HTTP server is hub/extender.py)
    "spawner.environ": CORE,  # the declared GPUSLICE_* variables (names, docs, a reader)
    "spawner.waitline": CORE,  # the GPU waiting line: fair order, who is placed now
    "spawner.line_timeouts": CORE,  # the line's timeouts: the settings read them without the line's numpy
    "spawner.jobs": CORE,  # batch jobs: the spec people send, states, endings in words (and jobs_backfill)
    "spawner.patrol": CORE,  # a card's health check, as data: which cards, what passes, who is out
    "spawner.anomaly": CORE,  # per-card anomaly models (scikit-learn): series in, findings out
    "spawner.usage": CORE,  # utilization reports: GPU-hours per user, class and week (CLI and portal)
    "spawner.scope": CORE,  # whose servers and names a viewer may see (the portal and the hub's line API)
    "spawner.words": CORE,  # times and places in the words people read (instants the pages localize)
    "spawner.cgroups": CORE,  # a server's limits and device rules, and each cgroup layout's files
    "spawner.assets": CORE,  # the kernel hook's and the JupyterLab files' folders (paths only)
    # 2. below the spawner runtime: the markets, the ledger, NVML, the spawners' metrics.
    "market": LOWER,
    "spawner.ledger": LOWER,
    "spawner.holds": LOWER,  # the ledger's rows of a placement and totals over rows (pure, over ledger.Held)
    "spawner.class_store": LOWER,  # the classes the running hub keeps (the hub, its spawners and the CLI share it)
    "spawner.sqlite_schema": LOWER,  # versioned schemas of our SQLite stores (the ledger, incidents)
    "spawner.job_ledger": LOWER,  # batch jobs in the ledger's file, in its transactions
    "spawner.card_health": LOWER,  # each card's last patrol, in the ledger's file
    "spawner.job_runner": LOWER,  # runs one attempt of a job, outside the hub's process tree
    "spawner.incident_schema": LOWER,  # the incident store's schema: the portal's store and `gpuslice upgrade`
    "spawner.line_admin": LOWER,  # reading and managing the GPU line in the ledger (the portal and the hub's API)
    "spawner.stop_events": LOWER,  # who stopped a pod, as Kubernetes Events (pure, beside the ledger)
    "spawner.gpus": LOWER,
    "spawner.metrics": LOWER,
    "spawner.lifetime": LOWER,
    "spawner.secretenv": LOWER,
    "spawner.ports": LOWER,
    "spawner.processes": LOWER,  # servers' processes by pid and start time (psutil)
    "spawner.cgroupfs": LOWER,  # the cgroup filesystem (v1, v2)
    "spawner.systemd_units": LOWER,  # systemd's transient scopes
    "spawner.confinement": LOWER,  # a server's cgroup by this machine's means (the two above)
    # 3. the spawner runtime: everything else in spawner/ (mixin and its parts, local, kube, mounts).
    "spawner": RUNTIME,
    "hub": HUB,
    "portal": PORTAL,
    "bench": BENCH,
}
# The kernel hook runs inside users' kernels and spawner/lab inside their notebook servers, where our
# packages are not installed; confined_start is run by path, as root.
STANDALONE = ("spawner.kernel_hook", "spawner.confined_start", "spawner.lab")
# What the portal may take from the hub (layer 4): the settings model and the chart's values reader.
PORTAL_FROM_HUB = ("hub.settings", "hub.kube_values")


def layer_of(module: str) -> int | None:
    """The layer of one of our modules (None: not ours)."""
    best = max(
        (p for p in LAYERS if module == p or module.startswith(p + ".") or module.startswith(p + "_")),
        key=len,
        default=None,
    )
    return None if best is None else LAYERS[best]


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    nested: bool = False  # inside a function or a block, not at the module's top level


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import of one of our packages in ``path``, relative ones resolved."""
    importer = module_name(path, root)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from spawner import metrics" imports the module spawner.metrics.
            names = [f"{base}.{alias.name}" if layer_of(f"{base}.{alias.name}") else base for alias in node.names]
        if names:
            nested = node.col_offset > 0  # type: ignore[attr-defined]  (an Import or ImportFrom here)
            found += [Import(importer, n, node.lineno, nested) for n in names if n.split(".")[0] in PACKAGES]
    return found


def violations(root: Path) -> list[str]:
    """Each upward import under ``root``, as a sentence naming both modules and their layers."""
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_of(path, root):
                problems += _check(imp, f"{path.relative_to(root)}:{imp.line}")
    return problems


def _check(imp: Import, where: str) -> list[str]:
    if imp.importer.startswith(STANDALONE):
        return [f"{where}: {imp.importer} runs standalone in users' kernels and may not import {imp.imported}"]
    mine, theirs = layer_of(imp.importer), layer_of(imp.imported)
    if mine is None or theirs is None:
        return []
    if theirs > mine:
        return [
            f"{where}: {imp.importer} ({LAYER_NAMES[mine]}, layer {mine}) imports {imp.imported} "
            f"({LAYER_NAMES[theirs]}, layer {theirs}): imports go downward only; move the shared piece "
            "to the lower layer (docs/architecture.md)"
        ]
    if mine == PORTAL and theirs == RUNTIME:
        return [f"{where}: the portal may not import the spawner runtime ({imp.imported}); use the layer below it"]
    if mine == PORTAL and theirs == HUB and not imp.imported.startswith(PORTAL_FROM_HUB):
        return [f"{where}: the portal takes only {', '.join(PORTAL_FROM_HUB)} from the hub, not {imp.imported}"]
    return []


def test_imports_go_one_way() -> None:
    assert violations(ROOT) == []


# The package-level order: each package imports only those before it (lazy imports too).
PACKAGE_ORDER = ("sizes", "market", "spawner", "hub", "portal", "bench")


def package_violations(root: Path) -> list[str]:
    """Each import of a package that comes later in PACKAGE_ORDER."""
    rank = {p: i for i, p in enumerate(PACKAGE_ORDER)}
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_of(path, root):
                if rank[imp.imported.split(".")[0]] > rank[package]:
                    problems.append(f"{path.relative_to(root)}:{imp.line}: package {package} imports {imp.imported}")
    return problems


def package_cycles(root: Path) -> list[list[str]]:
    """Every cycle between packages (a -> b -> ... -> a) in the imports under ``root``, lazy ones too."""
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            edges[package] |= {imp.imported.split(".")[0] for imp in imports_of(path, root)} - {package}
    cycles = []
    for start in PACKAGES:
        stack = [(start, [start])]
        while stack:
            here, trail = stack.pop()
            for there in sorted(edges[here]):
                if there == start:
                    cycles.append([*trail, start])
                elif there not in trail and there > start:  # each cycle once, from its smallest package
                    stack.append((there, [*trail, there]))
    return cycles


def test_packages_import_each_other_in_no_cycle() -> None:
    assert package_cycles(ROOT) == []


def test_every_package_imports_only_the_packages_below_it() -> None:
    assert package_violations(ROOT) == []


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        (
            "spawner/mixin.py",
            "from hub import metrics\n",
            "spawner.mixin (spawner runtime, layer 3) imports hub.metrics",
        ),
        ("spawner/quotas.py", "def f():\n    import spawner.ledger\n", "imports spawner.ledger"),
        ("market/store.py", "from spawner.mixin import x\n", "imports spawner.mixin"),
        ("hub/cli.py", "from portal import app\n", "imports portal.app"),
        ("hub/cli.py", "from bench.spawn import run\n", "imports bench.spawn"),
        ("hub/cli.py", "def f():\n    from bench.spawn import run\n", "imports bench.spawn"),  # lazy: the same
        ("market/catalog.py", "from sizes import parse_quantity\n", None),
        ("hub/platform.py", "def f():\n    from bench.spawn import run\n", "imports bench.spawn"),
        ("portal/gate.py", "from hub.with_hub import die_with_parent\n", "takes only hub.settings, hub.kube_values"),
        ("portal/x.py", "from spawner.mixin import machine\n", "may not import the spawner runtime"),
        ("portal/y.py", "from spawner.gpus import machine\nfrom hub.settings import load\n", None),  # allowed
        ("spawner/kernel_hook/gpuslice_limits.py", "from spawner import shares\n", "runs standalone"),
        ("hub/data/y.py", "from ..settings import load\nfrom ...portal import z\n", "imports portal.z"),
    ],
)
def test_an_upward_import_is_caught(tmp_path: Path, module: str, source: str, complaint: str | None) -> None:
    """The checker itself, on a tree with one deliberate import (so the test above can fail)."""
    path = tmp_path / module
    path.parent.mkdir(parents=True)
    path.write_text(source)
    found = violations(tmp_path)
    if complaint is None:
        assert found == []
    else:
        assert len(found) == 1 and complaint in found[0], found


def test_an_upward_package_import_is_caught(tmp_path: Path) -> None:
    for module, source in [
        ("market/a.py", "from spawner.shares import parse_quantity\n"),
        ("spawner/b.py", "def f():\n    import hub\n"),
        ("sizes/c.py", "\n"),
    ]:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    assert sorted(package_violations(tmp_path)) == [
        "market/a.py:1: package market imports spawner.shares.parse_quantity",
        "spawner/b.py:2: package spawner imports hub",
    ]


def test_a_cycle_through_a_lazy_import_is_caught(tmp_path: Path) -> None:
    """The two cycles there were: hub's command importing the benchmarks, the markets the GPU request parser."""
    for module, source in [
        ("hub/cli.py", "def bench():\n    from bench.spawn import run\n"),
        ("bench/spawn.py", "from hub.settings import load\n"),
        ("market/catalog.py", "from spawner.shares import parse_quantity\n"),
        ("spawner/images.py", "from market.store import Store\n"),
    ]:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    assert sorted(package_cycles(tmp_path)) == [["bench", "hub", "bench"], ["market", "spawner", "market"]]
