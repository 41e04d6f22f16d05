"""`python -m hub.job_dispatch`: jobs from the GPU line to their runners (a hub-managed service).

Every ``--interval`` seconds it takes one look at the line in the ledger (spawner/job_ledger.py
``dispatch``, one transaction): the queued jobs are marked present (this service is their
presence, as a waiting spawn is a server's), the line's own ``admit`` (spawner/waitline.py) says
which requests go now, and of those the jobs are placed here, their slices written in the same
transaction (servers place themselves at their spawn's next look); ``preemptions``
(spawner/jobs_backfill.py) says which backfill jobs yield to a person who waits, and they are
asked to stop. Then each placed job's runner is started (spawner/job_launch.py on one machine; a
Kubernetes Job on a cluster), and each job asked to stop has its runner told (SIGTERM).

The service ends with the hub (hub/with_hub.py), the jobs do not: their runners are in sessions of
their own. A new hub's service finds them in the ledger: a running one's runner writes its end
itself; a placed one whose runner never started (the hub was killed in between) gets one now; one
whose runner is gone (killed, the machine restarted) is a lost attempt, retried if it may be.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spawner.assets import HOOK_DIR
from spawner.card_health import CardLedger
from spawner.cgroups import DEFAULT_LIMITS, parse_settings_limits
from spawner.class_store import ClassStore
from spawner.confinement import for_machine
from spawner.gpus import machine
from spawner.holds import group_bytes_of, placement_rows, servers_by_user
from spawner.inventory import Inventory, build_local
from spawner.job_launch import Machine, placed_words, start_runner
from spawner.job_ledger import Dispatch, JobLedger, JobRecord, Looked, Placement, Stop, needs_gpu
from spawner.job_runner import lost
from spawner.jobs import FAILED, PREEMPT, RUNNING, STARTING, STOPPING, Outcome, job_server
from spawner.jobs_backfill import Running, preemptions
from spawner.ledger import Held
from spawner.patrol import with_health
from spawner.placement import Choice
from spawner.processes import running
from spawner.quotas import DEFAULT_GROUP, GroupRules, budgets, read_groups
from spawner.waitline import Entry, Reservation, admit

log = logging.getLogger("gpuslice.jobs")
RUNNER_START_S = 60.0  # a placed job's runner that has not said it is up by then is taken for lost


RowsFor = Callable[[JobRecord, Inventory, str | None, Choice | None], list[Held]]


def local_rows(job: JobRecord, inventory: Inventory, group: str | None, choice: Choice | None) -> list[Held]:
    """One machine: the ledger holds the job's slice, a row per card."""
    return placement_rows(job.key, job_server(job.id), job.plan.request, inventory, group, choice)


def preempt_words(entry: Entry) -> str:
    """Why a backfill job stops, in words its owner reads: for whom."""
    what = "a job" if "/job:" in entry.key else "a notebook server"
    return f"preempted for {entry.user} ({what}, {entry.label or 'a GPU'})"


def decide(
    holds: list[Held],
    line: list[Entry],
    reservations: list[Reservation],
    jobs: Looked,
    *,
    inventory_of: Callable[[list[Held]], Inventory],
    words: Callable[[list[Held]], str],
    budgets_now: Mapping[str, int | None],
    policy: str,
    now: float,
    rows_for: RowsFor | None = None,
    most_cpu_jobs: int = DEFAULT_LIMITS.cpu_jobs,
) -> Dispatch:
    """One look at the line: the queued jobs it admits now, where, and the backfill jobs to stop for a person.

    ``rows_for``: the ledger rows a placement holds (one machine's default; on a cluster none: the pod holds it).
    ``most_cpu_jobs``: CPU-only jobs one person may have active at once (``limits.cpu_jobs``): they wait for no
    slice, so without it a loop of submissions would run 200 processes at once on the machine's cores and memory.
    """
    inventory = inventory_of(holds)
    held_by_user = servers_by_user(holds)
    group_bytes = group_bytes_of(holds)
    placements, waiting = cpu_placements(jobs, most_cpu_jobs)
    for admitted in admit(
        line,
        inventory,
        budgets=budgets_now,
        group_bytes=group_bytes,
        held_by_user=held_by_user,
        policy=policy,
        now=now,
        reservations=reservations,
    ):
        job = jobs.queued(admitted.entry.key)
        if job is None:
            continue  # a server: its own spawn takes the room at its next look
        rows = (rows_for or local_rows)(job, inventory, job.plan.group, admitted.choice)
        placements.append(Placement(job.id, rows, words(rows)))
    running_backfill = [
        Running(j.key, j.user, j.plan.group, j.plan.asked_bytes, j.started or now)
        for j in jobs.active
        if j.spec.backfill and j.state in (STARTING, RUNNING)
    ]
    stopping = {j.key for j in jobs.active if j.state == STOPPING}
    chosen = preemptions(
        line,
        inventory,
        running_backfill,
        stopping=stopping,
        budgets=budgets_now,
        group_bytes=group_bytes,
        held_by_user=held_by_user,
        now=now,
        policy=policy,
        reservations=reservations,
    )
    by_key = {j.key: j for j in jobs.active}
    stops = [Stop(by_key[p.key].id, PREEMPT, preempt_words(p.for_entry)) for p in chosen]
    return Dispatch(placements, stops, waiting)


def cpu_placements(jobs: Looked, most: int) -> tuple[list[Placement], dict[int, str]]:
    """The CPU-only jobs that start now (they wait for no slice), oldest first, at most ``most`` active per person
    at once; the others stay queued, with why in words (by job id)."""
    active = Counter(j.user for j in jobs.active if not needs_gpu(j.plan))
    placements, waiting = [], {}
    for job in jobs.cpu_queued:
        if active[job.user] >= most:
            waiting[job.id] = (
                f"waiting: {job.user} has {most} CPU-only jobs running, the most one person may at once;"
                " it starts when one ends"
            )
            continue
        active[job.user] += 1
        placements.append(Placement(job.id, [], "no GPU"))
    return placements, waiting


def signal_runner(job: JobRecord) -> bool:
    """Tell a job's runner to stop it (the ledger says why); whether there was a runner to tell."""
    if job.runner is None or not running(job.runner):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(job.runner.pid, signal.SIGTERM)
        return True
    return False


class Dispatcher:
    """The service's state between looks: the runners it started (to reap them, and to know one is coming)."""

    def __init__(
        self,
        ledger: JobLedger,
        machine_: Machine,
        rules: Callable[[], Sequence[GroupRules]],
        policy: str = "default",
        most_cpu_jobs: int = DEFAULT_LIMITS.cpu_jobs,
    ) -> None:
        self.ledger, self.machine, self.rules, self.policy = ledger, machine_, rules, policy
        self.most_cpu_jobs = most_cpu_jobs
        self.launched: dict[int, tuple[float, subprocess.Popen[bytes]]] = {}

    def _inventory(self, holds: list[Held]) -> Inventory:
        gpus = with_health(self.machine.gpus, CardLedger(self.ledger.path).out_of_placement())  # patrols' failures
        return build_local(gpus, [(h.gpu_index, h.allocation()) for h in holds])

    def step(self, now: float) -> Dispatch:
        budgets_now = budgets(list(self.rules()))
        decided, active = self.ledger.dispatch(
            lambda holds, line, reservations, jobs: decide(
                holds,
                line,
                reservations,
                jobs,
                inventory_of=self._inventory,
                words=lambda rows: placed_words(self.machine, rows),
                budgets_now=budgets_now,
                policy=self.policy,
                now=now,
                most_cpu_jobs=self.most_cpu_jobs,
            )
        )
        for placement in decided.placements:
            job = active.get(placement.job)
            if job is not None:
                self._start(job, placement.rows)
        for stop in decided.stops:
            job = active.get(stop.job)
            if job is not None and signal_runner(job):
                log.info("gpuslice jobs: job %s (%s) stopping: %s", job.id, job.user, stop.reason)
        self._watch(active, now)
        return decided

    def _start(self, job: JobRecord, rows: list[Held]) -> None:
        """Start a placed job's runner; one that cannot start (its owner made ~/models a file, the disk is full)
        fails the job and frees its slice: it must neither hold the slice for ever nor stop the look for others."""
        try:
            process = start_runner(self.machine, self.ledger.path, job, rows)
        except Exception as exc:  # anything: the job is already placed, only finishing it frees its slice
            log.exception("gpuslice jobs: job %s (%s) could not start", job.id, job.user)
            failed = Outcome(FAILED, f"could not start: {_error_words(exc)}", failed=True)
            self.ledger.finish(job.id, failed, None, None)
            return
        self.launched[job.id] = (time.monotonic(), process)
        log.info("gpuslice jobs: job %s (%s) placed: %s", job.id, job.user, placed_words(self.machine, rows))

    def _watch(self, active: Mapping[int, JobRecord], now: float) -> None:
        """Reap ended runners; start a runner for a placed job that has none (the hub was killed between its
        placement and its runner's start); end as lost a job whose runner is gone."""
        for job_id, (_, process) in list(self.launched.items()):
            if process.poll() is not None and job_id not in active:
                del self.launched[job_id]
        holds: dict[str, list[Held]] | None = None  # read once, if a runner must be started again
        for job in active.values():
            if job.runner is not None:
                if not running(job.runner):
                    self._lost(job, "its runner ended without writing how the job went (killed, or a restart)")
                continue
            launched = self.launched.get(job.id)
            if launched is None:
                holds = holds if holds is not None else _holds_by_key(self.ledger.holdings())
                log.info("gpuslice jobs: job %s was placed but its runner never started: starting it", job.id)
                self._start(job, holds.get(job.key, []))
            elif launched[1].poll() is not None or time.monotonic() - launched[0] > RUNNER_START_S:
                self._lost(job, "its runner did not start")

    def _lost(self, job: JobRecord, why: str) -> None:
        after = lost(self.ledger, job, why, self.machine.confinement, self.machine.jobs_dir)
        self.launched.pop(job.id, None)
        log.warning("gpuslice jobs: job %s (%s): %s; now %s", job.id, job.user, why, after.state if after else "gone")


def _error_words(exc: Exception) -> str:
    """An error in its owner's words: the system's sentence and the path it is about, not a traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def _holds_by_key(holds: list[Held]) -> dict[str, list[Held]]:
    found: dict[str, list[Held]] = {}
    for h in holds:
        found.setdefault(h.key, []).append(h)
    return found


def rules_reader(configured: Sequence[GroupRules], classes: Path | None) -> Callable[[], list[GroupRules]]:
    """The groups' rules at each look, as the spawners read them: the class store's classes (they change live)
    and the configured default rules; without a store, the configured groups."""

    def now() -> list[GroupRules]:
        if classes is None:
            return list(configured)
        return [*ClassStore(classes).groups(), *(g for g in configured if g.name == DEFAULT_GROUP)]

    return now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, required=True, help="the ledger's SQLite file")
    parser.add_argument("--groups", default="[]", help="the configured groups' rules, as JSON")
    parser.add_argument("--classes", type=Path, help="the class store (classes that change live)")
    parser.add_argument("--policy", default="default", help="the placement policy")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the line")
    parser.add_argument("--limits", default="{}", help="the settings' limits, as JSON (cpu_jobs; one machine: all)")
    local = parser.add_argument_group("one machine")
    local.add_argument("--data-dir", type=Path, help="the platform's data folder (jobs' logs)")
    local.add_argument("--simulate", default="", help="GPUs to simulate when NVML finds none")
    local.add_argument("--hook-dir", default=str(HOOK_DIR), help="the kernel hook's folder (on jobs' PYTHONPATH)")
    local.add_argument("--device-dir", type=Path, default=Path("/dev"), help="where the GPUs' device nodes are")
    kube = parser.add_argument_group("Kubernetes")
    kube.add_argument("--kube-namespace", default="", help="run jobs as batch/v1 Jobs in this namespace")
    kube.add_argument("--kube-backend", default="gpushare", help="the GPU sharing backend (spawner/sharing/)")
    kube.add_argument("--kube-backend-settings", default="{}", help="the backend's own settings, as JSON")
    kube.add_argument("--scheduler-name", default="", help="the scheduler of pods holding a GPU")
    kube.add_argument("--models-claim", default="", help="the model market's PersistentVolumeClaim")
    kube.add_argument("--home-claim", default="", help='users\' home claims, e.g. "claim-{username}"')
    kube.add_argument("--ttl", type=int, default=86400, help="seconds a finished Job is kept")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    rules = rules_reader(read_groups(json.loads(args.groups)), args.classes)
    ledger = JobLedger(args.ledger)
    try:
        if args.kube_namespace:
            asyncio.run(_run_kube(args, ledger, rules))
        else:
            _run_local(args, ledger, rules)
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        return


def cpu_jobs(args: argparse.Namespace) -> int:
    """The settings' ``limits.cpu_jobs`` (the chart's ``custom.gpuslice.limits``), checked as `gpuslice up` does."""
    return parse_settings_limits(json.loads(args.limits))[0].cpu_jobs


def _run_local(args: argparse.Namespace, ledger: JobLedger, rules: Callable[[], list[GroupRules]]) -> None:
    if args.data_dir is None:
        raise SystemExit("hub.job_dispatch: give --data-dir (one machine) or --kube-namespace (Kubernetes)")
    data_dir = args.data_dir.absolute()
    local = Machine(
        data_dir=data_dir,
        gpus=machine(args.simulate).gpus,
        hook_dir=args.hook_dir,
        limits=json.loads(args.limits),
        confinement=for_machine(data_dir),
        device_dir=args.device_dir,
    )
    dispatcher = Dispatcher(ledger, local, rules, args.policy, cpu_jobs(args))
    while True:
        try:
            dispatcher.step(time.time())
        except Exception:  # one bad look (a locked file, a runner that would not start) is not the last
            log.exception("gpuslice jobs: a look at the line failed; trying again")
        time.sleep(args.interval)


async def _run_kube(args: argparse.Namespace, ledger: JobLedger, rules: Callable[[], list[GroupRules]]) -> None:
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config import ConfigException

    from hub.job_dispatch_kube import KubeJobs, job_pod_from_args, run
    from spawner import sharing

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException:
        await config.load_kube_config()
    backend = sharing.backend(args.kube_backend, **json.loads(args.kube_backend_settings))
    pod = job_pod_from_args(args.kube_namespace, args.scheduler_name, args.models_claim, args.home_claim, args.ttl)
    async with client.ApiClient() as api:
        jobs = KubeJobs(ledger, client.CoreV1Api(api), backend, pod, rules, args.policy, most_cpu_jobs=cpu_jobs(args))
        await run(jobs, args.interval)


if __name__ == "__main__":
    main()
