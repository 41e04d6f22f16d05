"""One machine: a placed job's process, confined as its owner's servers are, and its runner started.

``launch`` builds what the runner starts (spawner/job_runner.py ``Launch``): the job's command
from its image's Python environment, its environment (the slice's, the kernel hook's, what it is
told of itself, its owner's variables), and the same confinement as a server's
(spawner/confinement.py: its own cgroup or systemd scope with its limits, the device nodes of its
cards only, a private /tmp, the models bound read-only, its owner's account). ``start_runner``
starts the runner in a session of its own, so that the hub's end is not the job's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spawner import environ, mounts
from spawner.cgroups import Limits, limits_for
from spawner.confinement import Confinement, Server, confine_command, nvidia_nodes, platform_id, unit_name
from spawner.inventory import Gpu
from spawner.job_ledger import JobRecord
from spawner.job_runner import Launch, launch_path, log_path
from spawner.jobs import GRACE_S, executed_path, job_env, notebook_path
from spawner.ledger import Held
from spawner.shares import format_bytes
from spawner.sharing.base import Target, cpu_only
from spawner.sharing.local import Local

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
NOTEBOOK_MODULE = "gpuslice_notebook"  # spawner/kernel_hook/gpuslice_notebook.py, on the job's PYTHONPATH


@dataclass(frozen=True)
class Machine:
    """What every job on this machine shares (the single machine's settings, as the hub has them)."""

    data_dir: Path
    gpus: Sequence[Gpu]
    hook_dir: str  # the kernel hook (and the notebook runner), readable by every account
    limits: Mapping[str, Any]  # the settings' limits (a class's own over them)
    confinement: Confinement | None
    device_dir: Path = Path("/dev")
    grace_s: float = GRACE_S
    python: str = sys.executable  # the runner's Python (the platform's)

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def simulated(self) -> bool:
        return any(g.simulated for g in self.gpus)


def job_limits(machine: Machine, job: JobRecord) -> Limits:
    """The class's limits (the one charged first), with the memory and CPU the job asked for within them."""
    base = limits_for(machine.limits, [job.plan.group] if job.plan.group else [])
    return replace(base, memory_bytes=job.plan.memory_bytes or base.memory_bytes, cpus=job.plan.cpus)


def slice_env(machine: Machine, job: JobRecord, holds: Sequence[Held]) -> dict[str, str]:
    """The slice as a server's environment has it: its cards pinned, the hook's cap (CPU only: no GPU seen)."""
    if not holds:
        return dict(cpu_only().env)
    by_index = {g.index: g for g in machine.gpus}
    cards = [by_index[h.gpu_index] for h in holds]
    devices = tuple(g.uuid if not g.simulated else str(g.index) for g in cards)
    env = dict(Local().render(job.plan.request, Target(card_bytes=cards[0].memory_bytes, devices=devices)).env)
    if machine.simulated:
        env[environ.SIMULATED.name] = "1"
    return env


def job_command(job: JobRecord) -> list[str]:
    """What the job runs: its command (found in its image first), or its notebook through nbclient."""
    python = str(Path(job.plan.target) / "bin" / "python")
    if job.spec.notebook is not None:
        notebook = notebook_path(job.spec.notebook)
        home = Path(job.plan.home)
        return [python, "-m", NOTEBOOK_MODULE, str(home / notebook), str(home / executed_path(notebook, job.id))]
    return list(job.spec.command or ())


def job_environment(machine: Machine, job: JobRecord, holds: Sequence[Held]) -> dict[str, str]:
    home = job.plan.home
    account = job.plan.account or job.user
    env = {
        "PATH": f"{Path(job.plan.target) / 'bin'}:{BASE_PATH}",
        "HOME": home,
        "USER": account,
        "LOGNAME": account,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",  # the log shows lines as they are printed, not when a buffer fills
        **job.spec.env,
        "PYTHONPATH": machine.hook_dir,  # the kernel hook caps frameworks to the slice, as in a server's kernels
        environ.MODELS_DIR.name: str(Path(home) / mounts.MODELS_DIRNAME),
        environ.JOB_USER.name: job.user,
        **job_env(job.id, job.attempts, job.spec, job.preemptions, machine.grace_s),
        **slice_env(machine, job, holds),
    }
    if job.plan.models:
        env[environ.MODELS.name] = ",".join(job.plan.models)
    return env


def _kept_under_tmp(machine: Machine, job: JobRecord) -> list[str]:
    """What the job needs from the machine's /tmp once its own is mounted there (tests keep everything there)."""
    paths = [Path(job.plan.home), Path(job.plan.target), Path(machine.hook_dir), machine.device_dir]
    return sorted({str(p.absolute()) for p in paths if p.absolute().is_relative_to("/tmp")})


def confined(machine: Machine, job: JobRecord, holds: Sequence[Held], inner: list[str]) -> tuple[list[str], str]:
    """``inner`` wrapped as a server's command is (spawner/local.py ``prepare_server``), and its unit's name.

    As root: its own cgroup or scope (or, with neither, a private /tmp and its account at least);
    not as root, the models as links in the home (the only way without mounts).
    """
    models_dir = Path(job.plan.home) / mounts.MODELS_DIRNAME
    models = {name: Path(source) for name, source in job.plan.models.items()}
    if os.geteuid() != 0:
        if models:
            mounts.add_links(models_dir, models)
        return inner, ""
    mounts.add_mountpoints(models_dir, models)
    unit = unit_name(platform_id(machine.data_dir), job.key, time.time()) if machine.confinement else ""
    server = Server(
        unit,
        job_limits(machine, job),
        {h.gpu_index for h in holds},
        user=job.plan.account,
        keep=_kept_under_tmp(machine, job),
        models={str(models_dir / name): str(source) for name, source in models.items()},
    )
    if machine.confinement is not None:
        return machine.confinement.command(server, nvidia_nodes(machine.device_dir), inner), unit
    return confine_command(server, [], inner), ""


def launch(machine: Machine, job: JobRecord, holds: Sequence[Held]) -> Launch:
    """The attempt's process for the runner: command, environment, confinement, log, limits."""
    command, unit = confined(machine, job, holds, job_command(job))
    limits = job_limits(machine, job)
    return Launch(
        command=command,
        env=job_environment(machine, job, holds),
        cwd=job.plan.home,
        log=str(log_path(machine.jobs_dir, job.id)),
        unit=unit,
        data_dir=str(machine.data_dir),
        time_limit_s=job.spec.time_limit_s,
        grace_s=machine.grace_s,
        memory_limit_bytes=limits.memory_bytes,
        file_limit_bytes=limits.job_file_bytes,
    )


def start_runner(machine: Machine, ledger_path: Path, job: JobRecord, holds: Sequence[Held]) -> subprocess.Popen[bytes]:
    """Write the attempt's launch and start its runner in a session of its own (the caller reaps it)."""
    folder = machine.jobs_dir / str(job.id)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    machine.jobs_dir.chmod(0o700)
    planned = launch(machine, job, holds)
    path = launch_path(machine.jobs_dir, job.id)
    planned.write(path)
    repo = str(Path(__file__).resolve().parents[1])
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "PYTHONPATH": repo}  # nothing of the hub's (its tokens) passes
    command = [machine.python, "-m", "spawner.job_runner", f"--ledger={ledger_path}", f"--job={job.id}"]
    with (folder / "runner.log").open("ab") as errors:  # the runner's own troubles, for admins
        return subprocess.Popen(
            [*command, f"--launch={path}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env=env,
            cwd=str(folder),
            start_new_session=True,
            close_fds=True,
        )


def placed_words(machine: Machine, holds: Sequence[Held]) -> str:
    """Where the job's slice is, in words ("4 GiB of GPU 0 (T4, simulated)"); "no GPU" for CPU only."""
    if not holds:
        return "no GPU"
    by_index = {g.index: g for g in machine.gpus}
    parts = []
    for h in holds:
        gpu = by_index[h.gpu_index]
        label = f"GPU {gpu.index} ({gpu.model}{', simulated' if gpu.simulated else ''})"
        parts.append(label if h.whole else f"{format_bytes(h.memory_bytes)} of {label}")
    return ", ".join(parts)
