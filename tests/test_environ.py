"""Every GPUSLICE_* environment variable is declared once, in spawner/environ.py, and documented;
the environment is read there only."""

import ast
import re
from pathlib import Path

from spawner import environ

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bGPUSLICE_[A-Z][A-Z_]*[A-Z]\b")
DECLARED = {v.name for v in environ.ALL}
PACKAGES = ("sizes", "hub", "portal", "spawner", "market", "bench")


def _names(paths: list[Path]) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): set(NAME.findall(p.read_text())) for p in paths}


def test_code_reads_the_variables_through_their_declarations() -> None:
    code = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
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
    assert sorted(name for name in DECLARED if f"`{name}`" not in docs) == []
    assert all(v.doc for v in environ.ALL)


# Where the process environment may be read: the declarations' one reader, the hand-over of
# secrets (to a 0600 file and back), the kernel hook (standalone in users' kernels) and the notebook
# servers' presence reports and their extensions (standalone in users' servers: JupyterHub's variables,
# not ours).
READERS = ("spawner/environ.py", "spawner/secretenv.py", "spawner/kernel_hook/", "spawner/lab/")


def environment_reads(path: Path) -> list[str]:
    """Each read of a variable in ``path``: os.environ.get/[...], os.getenv, and a declaration's get/require."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            call = (ast.unparse(node.value), node.attr)
            read = call in (("os.environ", "get"), ("os.environ", "pop"), ("os", "getenv"))
            declared = node.attr in ("get", "require") and re.fullmatch(r"environ\.[A-Z_]+", call[0])
        elif isinstance(node, ast.Subscript):
            read, declared = isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ", None
        else:
            continue
        if read or declared:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_environment_is_read_in_one_module() -> None:
    code = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    reads = [r for p in code if not str(p.relative_to(ROOT)).startswith(READERS) for r in environment_reads(p)]
    assert reads == [], "read the environment through spawner.environ.read() (the settings apply it)"


def test_a_read_of_the_environment_elsewhere_is_caught() -> None:
    for source in [
        "import os\nx = os.environ.get('HOME')\n",
        "import os\nx = os.environ['HOME']\n",
        "import os\nx = os.getenv('HOME')\n",
        "from spawner import environ\nx = environ.DATA_DIR.get()\n",
        "from spawner import environ\nx = environ.HUB_URL.require()\n",
    ]:
        assert len(environment_reads_of(source)) == 1, source
    assert environment_reads_of("import os\nenv = {**os.environ, 'A': '1'}\nos.environ['B'] = '2'\n") == []


def environment_reads_of(source: str) -> list[str]:
    path = ROOT / "tests" / "environ_probe.py"
    path.write_text(source)
    try:
        return environment_reads(path)
    finally:
        path.unlink()
