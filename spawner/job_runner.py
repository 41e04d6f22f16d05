"""`python -m spawner.job_runner --ledger FILE --job ID`: run one attempt of a job and write how it ended.

The dispatcher (hub/job_dispatch.py) places a job, writes its launch (``Launch``: the command,
already wrapped in the job's confinement, its environment, its log) and starts this runner in a
session of its own: not a child the hub's death takes with it, so jobs run through hub restarts,
kill -9 included. The runner records itself in the ledger, starts the job with its output going
to the job's log file, and waits on signals only (SIGCHLD: the job ended; SIGTERM: someone asked it
to stop, the ledger says who and why; the time limit: the wait's timeout). A job asked to stop gets
SIGTERM, ``grace_s`` to checkpoint, then SIGKILL, and whatever it left in its cgroup is ended. Then
the runner releases the slice and writes the outcome in one transaction (spawner/job_ledger.py
``finish``): the job is done, or back in line for a retry or after a preemption.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

from spawner.confinement import Confinement, for_machine
from spawner.job_ledger import JobLedger, JobRecord
from spawner.jobs import LOST, SHUTDOWN, TIME_LIMIT, Ending, duration_words, line_entry, outcome
from spawner.lifetime import die_with_parent
from spawner.processes import Proc, identify, running

LOG_TAIL_BYTES = 16 * 1024  # how much of the log's end the runner reads to say why a job failed
WATCHED = {signal.SIGTERM, signal.SIGCHLD}


@dataclass(frozen=True)
class Launch:
    """One attempt's process, as the dispatcher prepared it."""

    command: list[str]
    env: dict[str, str]
    cwd: str
    log: str  # the job's log file (its folder is the platform's: only the owner and admins read it, via the hub)
    unit: str = ""  # the cgroup or systemd scope the command joins ("" : none)
    data_dir: str = ""  # the platform's data folder: which confinement the unit belongs to
    time_limit_s: float = 3600.0
    grace_s: float = 30.0
    memory_limit_bytes: int | None = None
    file_limit_bytes: int | None = None  # the largest file the job writes, its output included (None: no limit)
    extra: dict[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out)

    @classmethod
    def read(cls, path: Path) -> Launch:
        return cls(**json.loads(path.read_text()))


def launch_path(jobs_dir: Path, job_id: int) -> Path:
    return jobs_dir / str(job_id) / "launch.json"


def log_path(jobs_dir: Path, job_id: int) -> Path:
    return jobs_dir / str(job_id) / "output.log"


def _in_the_job(file_limit_bytes: int | None = None) -> None:
    """In the job's process, before exec: no file it writes (its output, on the platform's data disk, included)
    grows past ``file_limit_bytes`` (SIGXFSZ, which Python ignores, kills it there); the runner's blocked and
    ignored signals are not the job's, and the job ends with
    its runner (killed, the runner's end could not be written: a job nobody watches would run on unseen; the
    dispatcher then counts the attempt lost). The kernel forgets this when the job becomes its owner's account
    (a change of credentials); its cgroup, removed with the attempt, stands for it there."""
    if file_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit_bytes, file_limit_bytes))
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    die_with_parent(signum=signal.SIGKILL)


class Runner:
    def __init__(self, ledger: JobLedger, job_id: int, launch: Launch, confinement: Confinement | None) -> None:
        self.ledger, self.job_id, self.launch, self.confinement = ledger, job_id, launch, confinement
        self.process: subprocess.Popen[bytes] | None = None

    def run(self) -> None:
        me = identify(os.getpid())
        assert me is not None
        job = self.ledger.runner_started(self.job_id, me, running)
        if job is None:
            return  # not placed (any more), or another runner has it: nothing to run
        with open(self.launch.log, "ab", buffering=0) as log:
            os.chmod(self.launch.log, 0o600)
            self._say(log, f"attempt {job.attempts} starting: {job.placed or 'no GPU'}")
            ending = self._attempt(job, log)
            after = self._finish(job, ending)
            self._say(log, f"attempt {job.attempts} ended: {after.reason if after else ending}")

    def _attempt(self, job: JobRecord, log: BinaryIO) -> Ending:
        if job.stop_kind:  # asked to stop before it started
            return Ending(None, job.stop_kind, job.stop_reason, start_error="stopped before it started")
        try:
            self.process = subprocess.Popen(
                self.launch.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.launch.env,
                cwd=self.launch.cwd,
                start_new_session=True,  # its own process group: signals reach everything it started
                preexec_fn=functools.partial(_in_the_job, self.launch.file_limit_bytes),
                close_fds=True,
            )
        except OSError as exc:
            return Ending(None, start_error=f"{exc.strerror or exc} ({self.launch.command[0]})")
        started = identify(self.process.pid)
        now = self.ledger.process_started(self.job_id, started or Proc(self.process.pid, time.time()), self.launch.unit)
        stop_kind, stop_reason = (now.stop_kind, now.stop_reason) if now else ("", "")
        if not stop_kind:
            stop_kind, stop_reason = self._wait(time.monotonic() + self.launch.time_limit_s)
        if stop_kind:
            self._stop()
        code = self.process.wait()
        self._end_leftovers()
        return Ending(code, stop_kind, stop_reason, self._log_tail(), output_full=self._output_full())

    def _wait(self, deadline: float) -> tuple[str, str]:
        """Until the job ends (("", "")), a stop is asked (its kind and reason) or the time limit passes."""
        assert self.process is not None
        while self.process.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = f"time limit of {duration_words(self.launch.time_limit_s)} reached"
                self.ledger.ask_stop(self.job_id, TIME_LIMIT, reason)  # shown while it stops
                return TIME_LIMIT, reason
            caught = signal.sigtimedwait(WATCHED, remaining)
            if caught is not None and caught.si_signo == signal.SIGTERM:
                job = self.ledger.job(self.job_id)
                if job is not None and job.stop_kind:
                    return job.stop_kind, job.stop_reason
                return SHUTDOWN, "its runner was told to stop"
        return "", ""

    def _stop(self) -> None:
        """SIGTERM to the job's process group, ``grace_s`` to end, then SIGKILL to all it left."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.launch.grace_s
        while self.process.poll() is None and (remaining := deadline - time.monotonic()) > 0:
            signal.sigtimedwait({signal.SIGCHLD}, remaining)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def _end_leftovers(self) -> None:
        """Whatever the job started and left running ends with it: its cgroup emptied, its process group killed."""
        if self.launch.unit and self.confinement is not None:
            self.confinement.remove(self.launch.unit)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def _output_full(self) -> bool:
        limit = self.launch.file_limit_bytes
        try:
            return limit is not None and os.stat(self.launch.log).st_size >= limit
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            with open(self.launch.log, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _finish(self, job: JobRecord, ending: Ending) -> JobRecord | None:
        result = outcome(
            ending,
            failures_before=job.failures,
            retries=job.spec.retries,
            time_limit_s=job.spec.time_limit_s,
            memory_limit_bytes=self.launch.memory_limit_bytes,
            file_limit_bytes=self.launch.file_limit_bytes,
            slice_words=job.plan.label,
        )
        now = time.time()
        requeue = line_entry(job.id, job.user, job.spec, job.plan, job.submitted, now)
        return self.ledger.finish(job.id, result, ending.exit_code, requeue)

    @staticmethod
    def _say(log: BinaryIO, words: str) -> None:
        """A line of the platform's own in the job's log, marked so that nobody takes it for the job's."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        log.write(f"\n--- gpuslice {stamp}: {words} ---\n".encode())


def lost(
    ledger: JobLedger, job: JobRecord, why: str, confinement: Confinement | None, jobs_dir: Path | None = None
) -> JobRecord | None:
    """A job whose runner is gone (killed, or the machine restarted): ended as a lost attempt, what it left
    running ended, retried if its retries allow (the dispatcher calls this). ``jobs_dir``: where the attempts'
    launches are (the runner may have died before it recorded the job's cgroup: the launch names it)."""
    if job.process is not None and running(job.process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.process.pid, signal.SIGKILL)
    unit = job.unit or (_planned_unit(jobs_dir, job) if jobs_dir else "")
    if unit and confinement is not None:
        confinement.remove(unit)
    ending = Ending(None, LOST, why)
    result = outcome(ending, failures_before=job.failures, retries=job.spec.retries, time_limit_s=job.spec.time_limit_s)
    requeue = line_entry(job.id, job.user, job.spec, job.plan, job.submitted, time.time())
    return ledger.finish(job.id, result, None, requeue)


def _planned_unit(jobs_dir: Path, job: JobRecord) -> str:
    """The cgroup or scope the dispatcher made for the job's current attempt (its launch file), if any."""
    launch = launch_path(jobs_dir, job.id)
    return Launch.read(launch).unit if launch.exists() else ""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m spawner.job_runner")
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--launch", type=Path, required=True)
    args = parser.parse_args(argv)
    # Blocked from the start: a stop asked while the runner starts waits for its sigtimedwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    launch = Launch.read(args.launch)
    confinement = for_machine(Path(launch.data_dir)) if launch.unit and launch.data_dir else None
    Runner(JobLedger(args.ledger), args.job, launch, confinement).run()


if __name__ == "__main__":
    main(sys.argv[1:])
