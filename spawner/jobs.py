"""Batch jobs: what a job is, what people may ask of one, its states, and how it ended in words. Pure code.

A job is a command or a notebook run headless as its owner, with a GPU request in the same
words as a server's (spawner/shares.py: "4GiB", "0.25", whole cards, "0" for CPU only), an
image and models from the markets, CPU and memory, environment variables, a time limit and a
number of retries. It waits in the one GPU line beside the servers (spawner/waitline.py): a
``normal`` job in fair-share order, a ``backfill`` job only on slices nobody waits for, stopped
(SIGTERM, a grace period, SIGKILL) and put back in line when a person needs its slice
(spawner/jobs_backfill.py decides which). docs/jobs.md tells it for people.

``JobSpec`` is what people send (the REST API's body, the command line, the portal's form):
unknown keys and bad values are refused in one sentence that says what to write. ``JobPlan``
is what the platform made of it when it was accepted (the image's environment, the models'
folders, the class charged), kept with the job so that a restarted hub runs it the same way.
``outcome`` turns how an attempt ended into the job's next state and the reason in words.
"""

from __future__ import annotations

import re
import signal
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from spawner import environ
from spawner.checked import Amount, Checked, Duration, duration_seconds
from spawner.placement import Demand
from spawner.shares import GpuRequest, format_bytes
from spawner.waitline import Entry

# A job's key in the line and the ledger: "ann/job:12". Server names are lowercase letters, digits
# and hyphens (JupyterHub's safe slugs), so no server can ever be taken for a job.
JOB_MARK = "job:"

QUEUED, STARTING, RUNNING, STOPPING = "queued", "starting", "running", "stopping"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
STATES = (QUEUED, STARTING, RUNNING, STOPPING, SUCCEEDED, FAILED, CANCELLED)
FINISHED = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({STARTING, RUNNING, STOPPING})  # holding its slice, with a runner watching it

# What may stop a running job: its owner (or a teacher, an admin) cancelling it, a person needing a
# backfill job's slice, the platform's full stop, the time limit, or the platform losing it.
CANCEL, PREEMPT, SHUTDOWN, TIME_LIMIT, LOST = "cancel", "preempt", "shutdown", "time-limit", "lost"
STOP_KINDS = (CANCEL, PREEMPT, SHUTDOWN, TIME_LIMIT, LOST)

PRIORITIES = ("normal", "backfill")
DEFAULT_TIME_LIMIT = "1h"
MOST_RETRIES = 10
MOST_QUEUED_PER_USER = 200  # jobs one person may have waiting at once (a loop cannot fill the line)
GRACE_S = 30.0  # from SIGTERM to SIGKILL when a job is stopped: time to write a checkpoint

# Exit statuses a shell gives a command it could not run; the job runner gives them too.
NOT_FOUND, NOT_EXECUTABLE = 127, 126
FILE_TOO_LARGE = int(signal.SIGXFSZ)  # what ends a job that writes past its file size limit (RLIMIT_FSIZE)

# What a framework prints when the GPU's memory (or the slice the kernel hook allows) runs out.
GPU_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
    r"|RESOURCE_EXHAUSTED: Out of memory|out of memory while trying to allocate",
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The platform's own variables: a job may not set them (its slice, its hook, who it is).
RESERVED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION", "PYTHONPATH", "HOME", "USER"}
    | {"LOGNAME", "SHELL", "LD_PRELOAD", "LD_LIBRARY_PATH"}
)
RESERVED_ENV_PREFIXES = ("GPUSLICE_", "JUPYTERHUB_")
MOST_ENV = 64
MOST_COMMAND_BYTES = 64 * 1024


def job_key(user: str, job_id: int) -> str:
    return f"{user}/{JOB_MARK}{job_id}"


def job_server(job_id: int) -> str:
    """The name a job has where servers have theirs (ledger rows, the exporter's per-process series)."""
    return f"{JOB_MARK}{job_id}"


def is_job_key(key: str) -> bool:
    return key.partition("/")[2].startswith(JOB_MARK)


def job_id_of(key: str) -> int | None:
    """The job's id in a key such as "ann/job:12" (None: a server's key)."""
    name = key.partition("/")[2]
    if not name.startswith(JOB_MARK) or not name[len(JOB_MARK) :].isdigit():
        return None
    return int(name[len(JOB_MARK) :])


def notebook_path(text: str) -> PurePosixPath:
    """A notebook's path relative to its owner's home; ValueError saying what to write.

    Relative, no ``..``, no ``~``, ending in .ipynb: a job reads and writes only under its
    owner's home (the runtime checks again where the path leads, links included).
    """
    if not text or "\0" in text or len(text) > 1024:
        raise ValueError("must be a notebook's path in your home folder, for example work/train.ipynb")
    path = PurePosixPath(text)
    if path.is_absolute() or text.startswith("~"):
        raise ValueError(f"must be relative to your home folder (work/train.ipynb), not {text!r}")
    if ".." in path.parts:
        raise ValueError(f"must stay inside your home folder: {text!r} climbs out with ..")
    if path.suffix != ".ipynb":
        raise ValueError(f"must be a notebook (.ipynb), not {text!r}")
    return path


def executed_path(notebook: PurePosixPath, job_id: int) -> PurePosixPath:
    """Where the executed copy of a notebook job goes: beside the original (train.job-12.ipynb)."""
    return notebook.with_name(f"{notebook.stem}.job-{job_id}.ipynb")


class JobSpec(Checked):
    """A job as people ask for it: the REST API's body, `gpuslice job submit`, the portal's form."""

    name: str = ""
    command: tuple[str, ...] | None = None  # the program and its arguments (no shell)
    notebook: str | None = None  # a notebook in the owner's home, run headless (nbclient)
    image: str = "default"
    gpu_memory: str = "0"  # as a server's: "4GiB", "0.25", "0" (CPU only)
    gpus: int = 0  # whole cards
    cpus: float | None = None  # CPU cores (a quota); None: the class's share
    memory: Amount | None = None  # "8GiB"; None: the class's memory limit
    env: dict[str, str] = Field(default_factory=dict)
    models: tuple[str, ...] = ()
    time_limit: Duration = DEFAULT_TIME_LIMIT
    retries: int = 0
    priority: Literal["normal", "backfill"] = "normal"

    @field_validator("name")
    @classmethod
    def _short_name(cls, value: str) -> str:
        if len(value) > 80 or any(ord(c) < 32 for c in value):
            raise ValueError("must be at most 80 characters on one line")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            raise ValueError('must be a list: the program and its arguments, for example ["python", "train.py"]')
        if not isinstance(value, list | tuple) or not value or not all(isinstance(a, str) for a in value):
            raise ValueError('must be a list of words, for example ["python", "train.py"]')
        if not value[0] or any("\0" in a for a in value) or sum(len(a.encode()) for a in value) > MOST_COMMAND_BYTES:
            raise ValueError("must name a program, with arguments of at most 64 KiB together and no NUL")
        return tuple(value)

    @field_validator("notebook")
    @classmethod
    def _notebook(cls, value: str | None) -> str | None:
        return None if value is None else str(notebook_path(value))

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _gpu_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("gpus", "retries", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"must be a whole number, 0 or more, not {value!r}")
        return value

    @field_validator("retries")
    @classmethod
    def _few_retries(cls, value: int) -> int:
        if value > MOST_RETRIES:
            raise ValueError(f"must be at most {MOST_RETRIES}")
        return value

    @field_validator("cpus", mode="before")
    @classmethod
    def _cores(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1024:
            raise ValueError(f"must be a number of CPU cores above 0, such as 2 or 0.5, not {value!r}")
        return float(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, dict) or len(value) > MOST_ENV:
            raise ValueError(f"must be a mapping of at most {MOST_ENV} variable names to text")
        for name, text in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a variable name: use letters, digits and _")
            if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"{name} is the platform's to set (the job's slice, its hook, its owner)")
            if not isinstance(text, str) or "\0" in text or len(text) > 8192:
                raise ValueError(f"{name} must be text of at most 8 KiB")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple) or not all(isinstance(m, str) and m for m in value):
            raise ValueError('must be a list of model ids, for example ["langid-97"]')
        return tuple(dict.fromkeys(value))

    @field_validator("time_limit")
    @classmethod
    def _some_time(cls, value: str | int | None) -> str | int:
        if value is None:
            raise ValueError("must be a duration such as 2h, 90min or 3600 (seconds)")
        return value

    @model_validator(mode="after")
    def _one_thing_to_run(self) -> JobSpec:
        if self.command is None and self.notebook is None:
            raise ValueError('give a command (a list such as ["python", "train.py"]) or a notebook to run')
        if self.command is not None and self.notebook is not None:
            raise ValueError("give a command or a notebook to run, not both")
        return self

    @property
    def time_limit_s(self) -> float:
        return duration_seconds(self.time_limit)

    @property
    def backfill(self) -> bool:
        return self.priority == "backfill"

    def title(self) -> str:
        """What people call the job: its name, else what it runs."""
        if self.name:
            return self.name
        return self.notebook or " ".join(self.command or ())[:80]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def stored(cls, data: dict[str, Any]) -> JobSpec:
        """A spec the ledger kept: checked when it was accepted, read back without checking again (a long
        line reads hundreds of them a second)."""
        fields = {**data, "command": tuple(data["command"]) if data.get("command") else None}
        fields["models"] = tuple(data.get("models") or ())
        return cls.model_construct(**fields)


@dataclass(frozen=True)
class JobPlan:
    """What the platform made of an accepted ``JobSpec`` (kept with the job: a restart runs it the same way).

    ``request_*`` is the GPU request as spawner/shares.py read it; ``target`` the image's Python
    environment (one machine) or container image (Kubernetes); ``models`` each model id's folder;
    ``group`` the class charged and ``asked_bytes`` what it is charged; ``account`` the Unix account
    it runs as ("" : the platform's); ``home`` its owner's home folder.
    """

    request_gpus: int
    request_memory_bytes: int | None
    request_fraction: float | None
    label: str  # the GPU request in words
    image: str
    target: str
    group: str | None
    asked_bytes: int
    home: str
    account: str = ""
    models: dict[str, str] = field(default_factory=dict)
    memory_bytes: int | None = None
    cpus: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobPlan:
        return cls(**data)

    @property
    def request(self) -> GpuRequest:
        return GpuRequest(self.request_gpus, self.request_memory_bytes, self.request_fraction)


def line_entry(job_id: int, user: str, spec: JobSpec, plan: JobPlan, arrived: float, now: float) -> Entry:
    """A job's place in the GPU line: its request, the class charged, backfill or not.

    ``arrived``: when it was submitted, also when it goes back in line after a retry or a
    preemption (it keeps its place among its owner's requests).
    """
    demand = Demand.from_request(plan.request)
    label = f"{plan.label}: job {job_id} ({spec.title()})"
    key = job_key(user, job_id)
    return Entry(key, user, demand, plan.asked_bytes, plan.group, arrived, 0, now, label, backfill=spec.backfill)


@dataclass(frozen=True)
class Ending:
    """How one attempt ended, as its runner saw it.

    ``exit_code``: the process's exit status (negative: the signal that ended it; None: it
    never started, ``start_error`` says why); ``stop_kind`` and ``stop_reason``: the stop asked
    for, if any (STOP_KINDS), in the words of whoever asked.
    """

    exit_code: int | None
    stop_kind: str = ""
    stop_reason: str = ""
    log_tail: str = ""
    start_error: str = ""
    output_full: bool = False  # its output reached the largest file a job may write (RLIMIT_FSIZE)


@dataclass(frozen=True)
class Outcome:
    """What becomes of a job after an attempt: its next state and why, in words."""

    state: str  # QUEUED (again), SUCCEEDED, FAILED or CANCELLED
    reason: str
    failed: bool = False  # the attempt failed (retries count it)
    preempted: bool = False


def _signal_name(number: int) -> str:
    names = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
    return names.get(number, f"signal {number}")


def failure_words(
    ending: Ending, memory_limit_bytes: int | None = None, slice_words: str = "", file_limit_bytes: int | None = None
) -> str:
    """Why an attempt that nobody stopped failed, in words (the exit code said too)."""
    if ending.exit_code is None:
        return f"could not start: {ending.start_error or 'the runner could not start it'}"
    if ending.exit_code == NOT_FOUND:
        return "could not start: command not found (exit code 127)"
    if ending.exit_code == NOT_EXECUTABLE:
        return "could not start: the command is not executable (exit code 126)"
    if ending.exit_code == -FILE_TOO_LARGE or ending.output_full:
        # SIGXFSZ kills a program that writes past the limit; Python ignores it and fails with EFBIG instead.
        limit = f" of {format_bytes(file_limit_bytes)}" if file_limit_bytes else ""
        return (
            f"file size limit{limit} reached: its output or a file it wrote grew too large"
            f" (exit code {ending.exit_code}); print less, or write large files in smaller parts"
        )
    if GPU_OOM.search(ending.log_tail):
        held = f" ({slice_words})" if slice_words else ""
        return f"out of GPU memory{held}: exit code {ending.exit_code}; ask for a larger slice or use less"
    if ending.exit_code < 0:
        signal = -ending.exit_code
        if signal == 9:
            limit = f" of {format_bytes(memory_limit_bytes)}" if memory_limit_bytes else ""
            return f"killed by SIGKILL: most likely out of memory (over its memory limit{limit})"
        return f"ended by {_signal_name(signal)}"
    return f"failed: exit code {ending.exit_code}"


def outcome(
    ending: Ending,
    *,
    failures_before: int,
    retries: int,
    time_limit_s: float,
    memory_limit_bytes: int | None = None,
    slice_words: str = "",
    file_limit_bytes: int | None = None,
) -> Outcome:
    """The job's next state after ``ending``, with the reason in words.

    A cancel ends it; a preemption or the platform's stop puts it back in line without using a
    retry; the time limit fails it for good (a retry would run out of time again), as does a
    command that cannot start; any other failure is retried while ``retries`` allow.
    """
    if ending.stop_kind == CANCEL:
        return Outcome(CANCELLED, ending.stop_reason or "cancelled")
    if ending.stop_kind == PREEMPT:
        return Outcome(QUEUED, f"{ending.stop_reason or 'preempted for a person'}; back in line", preempted=True)
    if ending.stop_kind == SHUTDOWN:
        return Outcome(QUEUED, "the platform stopped; back in line to run again")
    if ending.exit_code == 0 and ending.stop_kind != TIME_LIMIT:
        return Outcome(SUCCEEDED, "finished: exit code 0")
    if ending.stop_kind == TIME_LIMIT:
        return Outcome(FAILED, f"time limit: stopped after {duration_words(time_limit_s)}", failed=True)
    if ending.stop_kind == LOST:
        why = f"node lost: {ending.stop_reason or 'the platform lost track of it'}"
    else:
        why = failure_words(ending, memory_limit_bytes, slice_words, file_limit_bytes)
    hopeless = ending.exit_code in (NOT_FOUND, NOT_EXECUTABLE, None) and ending.stop_kind != LOST
    left = retries - (failures_before + 1)
    if hopeless or left < 0:
        return Outcome(FAILED, why, failed=True)
    return Outcome(QUEUED, f"{why}; retrying ({left} retr{'y' if left == 1 else 'ies'} left after this one)", True)


def duration_words(seconds: float) -> str:
    """3725 -> "1 h 2 min", 90 -> "1 min 30 s"."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h" if hours else "", f"{minutes} min" if minutes else "", f"{secs} s" if secs else ""]
    return " ".join(p for p in parts if p) or "0 s"


def job_env(job_id: int, attempt: int, spec: JobSpec, preemptions: int, grace_s: float = GRACE_S) -> dict[str, str]:
    """What a job is told of itself: its id and attempt; a backfill job that it may be stopped (SIGTERM,
    then ``grace_s`` to checkpoint before SIGKILL) and how many times it has been, so it can resume."""
    env = {
        environ.JOB_ID.name: str(job_id),
        environ.JOB_ATTEMPT.name: str(attempt),
        environ.JOB_PRIORITY.name: spec.priority,
        environ.JOB_GRACE_S.name: f"{grace_s:g}",
        environ.JOB_TIME_LIMIT_S.name: f"{spec.time_limit_s:g}",
    }
    if spec.backfill:
        env[environ.JOB_PREEMPTIBLE.name] = "1"
        env[environ.JOB_PREEMPTED.name] = str(preemptions)
    return env
