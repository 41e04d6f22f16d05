"""Every GPUSLICE_* environment variable is declared once, in spawner/environ.py, and documented."""

import re
from pathlib import Path

from spawner import environ

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bGPUSLICE_[A-Z][A-Z_]*[A-Z]\b")
DECLARED = {v.name for v in environ.ALL}


def _names(paths: list[Path]) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): set(NAME.findall(p.read_text())) for p in paths}


def test_code_reads_the_variables_through_their_declarations() -> None:
    code = [p for pkg in ("hub", "portal", "spawner", "market", "bench") for p in (ROOT / pkg).rglob("*.py")]
    literal = {
        path: names
        for path, names in _names(code).items()
        if names and path != "spawner/environ.py" and not path.startswith("spawner/kernel_hook/")
    }
    assert literal == {}, "use spawner.environ.<VAR> instead of the literal name"


def test_every_name_used_anywhere_is_declared() -> None:
    """The chart sets them and the kernel hook (which cannot import ours) reads them by name."""
    files = [*(ROOT / "helm").rglob("*.yaml"), *(ROOT / "spawner" / "kernel_hook").rglob("*.py")]
    used = {path: names - DECLARED for path, names in _names(files).items()}
    assert {path: names for path, names in used.items() if names} == {}


def test_every_variable_is_documented() -> None:
    docs = (ROOT / "docs" / "platform.md").read_text()
    assert sorted(DECLARED - set(NAME.findall(docs))) == []
    assert all(v.doc for v in environ.ALL)
