"""A student's account tries to read what it must not (issue 13), against a real running platform.

Run as root (the suite does): the test makes a system account that stands for a student's
(what `isolation: unix-users` gives every user) and, as that account, tries to read each
secret in the data folder, the environment of every platform process (the portal's
Streamlit holds the identity key there) and another user's home.
"""

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.platform import Platform

STUDENT = "gpuslice-probe"
PROBE = """
import json, sys
read = []
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        read.append(path)
    except OSError:
        pass
print(json.dumps(read))
"""


@pytest.fixture
def student() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("the attacker test makes a system account: run it as root (CI does)")
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STUDENT], check=False)
    try:
        yield pwd.getpwnam(STUDENT)
    finally:
        subprocess.run(["userdel", STUDENT], check=False, capture_output=True)


def platform_pids(platform: Platform) -> list[int]:
    """Every process of this platform: the hub, the proxy, the portal gate, Streamlit, notebook servers."""
    mine: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/environ"):
        try:
            if (
                f"{platform.data_dir}".encode() in stat.read_bytes()
                or str(platform.config).encode() in stat.read_bytes()
            ):
                mine.append(int(stat.parent.name))
        except OSError:
            continue
    return mine


def test_a_student_account_reads_no_secret_no_environment_and_no_other_home(student: pwd.struct_passwd) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpuslice-attack-"))
    root.chmod(0o755)  # the student may walk up to the data folder: the data folder itself must stop them
    platform = Platform(root, {"groups": {"ml101": {"members": ["bob"]}}})
    platform.data_dir.mkdir(mode=0o755)  # as an admin might have made it; gpuslice must close it
    platform.start()
    try:
        bob = platform.login("bob")
        assert bob.api("POST", "/users/bob/server", json={"gpu_memory": "0"}).status_code in (201, 202)
        bob.wait_ready("bob")
        secrets = [str(p) for p in platform.data_dir.rglob("*") if p.is_file()]
        assert any(p.endswith("jupyterhub_cookie_secret") for p in secrets), secrets
        environs = [f"/proc/{pid}/environ" for pid in platform_pids(platform)]
        assert len(environs) >= 4, environs  # hub, proxy, gate, Streamlit (and bob's server)
        targets = [*secrets, *environs, str(platform.data_dir / "homes" / "bob" / ".bash_history")]
        (platform.data_dir / "homes" / "bob" / ".bash_history").write_text("bob's own")
        probe = subprocess.run(
            ["/usr/bin/python3", "-c", PROBE, *targets],
            user=student.pw_uid,
            group=student.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        assert probe.returncode == 0, probe.stderr
        assert json.loads(probe.stdout) == [], "a student's account could read these"
        assert platform.data_dir.stat().st_mode & 0o777 == 0o700
    finally:
        platform.stop()
        shutil.rmtree(root, ignore_errors=True)
