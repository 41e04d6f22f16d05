"""The portal benchmark's browsers in a cgroup of their own: the launcher Playwright starts as Chromium."""

import subprocess
from pathlib import Path

import pytest

from bench.portal import launcher_script

pytestmark = pytest.mark.process


def test_the_launcher_puts_the_program_itself_in_each_cgroup_and_passes_its_arguments(tmp_path: Path) -> None:
    # cgroup.procs stand-ins in folders whose names a shell would split or unquote.
    procs = [tmp_path / "cpu's folder" / "cgroup.procs", tmp_path / "memory $HOME" / "cgroup.procs"]
    for path in procs:
        path.parent.mkdir()
        path.touch()
    launcher = tmp_path / "chromium"
    launcher.write_text(launcher_script(procs, "/bin/sh"))
    launcher.chmod(0o755)

    shown = subprocess.run(
        [str(launcher), "-c", 'echo "$$|$1"', "sh", "an argument, with spaces"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()

    pid, argument = shown.split("|")
    assert [path.read_text().strip() for path in procs] == [pid, pid]  # the program's own PID: exec kept it
    assert argument == "an argument, with spaces"


def test_the_launcher_stops_before_the_program_when_it_cannot_join(tmp_path: Path) -> None:
    launcher = tmp_path / "chromium"
    launcher.write_text(launcher_script([tmp_path / "no such cgroup" / "cgroup.procs"], "/bin/echo"))
    launcher.chmod(0o755)

    ran = subprocess.run([str(launcher), "started anyway"], capture_output=True, text=True, timeout=30)

    assert ran.returncode != 0 and "started anyway" not in ran.stdout
