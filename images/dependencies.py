"""Print the requirements pyproject.toml declares (and those of the extras named, and its build backend), one a line.

The platform images install these in a layer of their own before they copy the code, so a change to
the code rebuilds only the small layer that installs gpuslice itself (``pip install --no-deps``), not
every dependency (a few minutes of downloads and unpacking per image). Runs in the image's Python
(3.11: tomllib), on the copy of pyproject.toml the Dockerfile gives it.

    python3 images/dependencies.py pyproject.toml [extra ...] > requirements.txt
"""

import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"no such extra in {pyproject}: {', '.join(unknown)} (it has {', '.join(optional)})")
    return [*project["dependencies"], *(r for extra in extras for r in optional[extra])]


def build_requirements(pyproject: str) -> list[str]:
    """What building gpuslice's wheel needs (``pip install --no-build-isolation`` finds it installed)."""
    with open(pyproject, "rb") as file:
        return list(tomllib.load(file)["build-system"]["requires"])


if __name__ == "__main__":
    print("\n".join([*requirements(sys.argv[1], sys.argv[2:]), *build_requirements(sys.argv[1])]))
