"""`gpuslice bench jobs`: batch jobs' three figures (docs/jobs.md#the-benchmark).

(1) ``overhead``: a GPU job of ``--job-seconds`` (30) submitted through the platform (a real
`gpuslice up` on simulated GPUs: the jobs API, the line, the dispatcher, a runner, the job confined as
its owner) timed from the submission to the API saying it succeeded, against the same command run
directly, alternately, ``--runs`` times each; the ratio at p50 (target <= 1.15) and the fixed overhead
in seconds.

(2) ``queue``: 1,000 jobs from 50 users (slices of 1 to 8 GiB, 20 each) queued at once on 16 simulated
16 GiB cards, dispatched by the dispatcher's own look at the line (hub/job_dispatch.py ``decide`` in
the ledger's transaction, spawner/job_ledger.py ``dispatch``) until all have run, each running for a
random number of looks: each look's wall time (p50, p99; target p99 < 20 ms) and the CPU it takes
at one look a second, which is what the dispatcher costs the hub's machine.

(3) ``night``: bench/jobs_night.py.
"""

from __future__ import annotations

import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile
from hub.job_dispatch import decide, local_rows
from hub.settings import load as load_settings
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.job_ledger import JobLedger
from spawner.jobs import FINISHED, SUCCEEDED, JobPlan, JobSpec, Outcome, line_entry
from spawner.shares import GiB


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _submit(ledger: JobLedger, user: str, gib: int) -> None:
    spec = JobSpec.model_validate({"command": ["python", "train.py"], "gpu_memory": f"{gib}GiB"})
    plan = JobPlan(0, gib * GiB, None, f"{gib} GiB of one GPU", "default", "/", None, gib * GiB, "/h")
    ledger.submit(user, spec, plan, lambda job_id, now: line_entry(job_id, user, spec, plan, now, now))


def queue(jobs: int = 1000, users: int = 50, cards: str = "16x16GiB:T4", seed: int = 7) -> dict[str, Any]:
    """(2): every look's time while 1,000 queued jobs drain (see the module's docstring)."""
    rng = random.Random(seed)
    gpus = simulated_gpus(cards)
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-jobs-") as folder:
        ledger = JobLedger(Path(folder) / "ledger.sqlite")
        for i in range(jobs):
            _submit(ledger, f"u{i % users:02d}", rng.choice((1, 2, 4, 8)))
        looks: list[float] = []  # each look's wall time: the ledger's transaction with the decision in it
        decisions: list[float] = []  # the decision alone (the line's admit, the placements, the preemptions)
        cpus: list[float] = []  # each look's CPU time
        choices: list[float] = []  # the decision for one job: a look's decision shared by the jobs it tried
        ends: dict[int, int] = {}  # job id -> the look at which it ends
        cpu_before, done, look = _cpu(), 0, 0

        def timed(holds: Any, line: Any, reservations: Any, records: Any) -> Any:
            started = time.perf_counter()
            decided = decide(
                holds,
                line,
                reservations,
                records,
                inventory_of=lambda rows: build_local(gpus, [(h.gpu_index, h.allocation()) for h in rows]),
                words=lambda rows: "",
                budgets_now={},
                policy="default",
                now=time.time(),
                rows_for=local_rows,
            )
            decisions.append(time.perf_counter() - started)
            # The line tries each job it places and the first it cannot place: one choice of a card each.
            choices.append(decisions[-1] / (len(decided.placements) + 1))
            return decided

        while done < jobs:
            look += 1
            started, cpu_started = time.perf_counter(), _cpu()
            decided, active = ledger.dispatch(timed)
            looks.append(time.perf_counter() - started)
            cpus.append(_cpu() - cpu_started)
            for placement in decided.placements:
                ends[placement.job] = look + rng.randint(1, 30)
            for job_id in active:
                if ends.get(job_id, 0) <= look:
                    ledger.finish(job_id, Outcome(SUCCEEDED, "finished: exit code 0"), 0, None)
                    done += 1
        cpu = _cpu() - cpu_before
    return {
        "jobs": jobs,
        "users": users,
        "cards": cards,
        "looks": len(looks),
        "look_ms": _ms(looks),
        "decision_ms": _ms(decisions),
        "decision_per_job_ms": _ms(choices),
        "look_cpu_ms": _ms(cpus),
        # The dispatcher's cost to the machine at one look a second: its looks' CPU (the bench's own
        # bookkeeping, the jobs finishing, is not in it).
        "cpu_share_at_one_look_a_second": sum(cpus) / len(cpus),
        "bench_cpu_s": cpu,
    }


def _ms(seconds: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(seconds, 50) * 1000,
        "p99": percentile(seconds, 99) * 1000,
        "max": max(seconds) * 1000,
        "mean": statistics.fmean(seconds) * 1000,
    }


def _job_python(settings_path: Path) -> str:
    """The Python a job's owner can run: the users' environment's where jobs run as their owners' accounts (the
    bench's own interpreter may be where they cannot read it), the bench's own otherwise."""
    settings = load_settings(settings_path)
    return str(settings.user_env / "bin" / "python") if settings.isolation == "unix-users" else sys.executable


def overhead(job_seconds: float = 30.0, runs: int = 3) -> dict[str, Any]:
    """(1): the same command through the platform and directly, alternately (see the module's docstring)."""
    from bench.spawn import Hub

    through: list[float] = []
    direct: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-jobs-") as root:
        hub = Hub("gpuslice", Path(root), simulate="1x16GiB:T4")
        try:
            command = [_job_python(hub.data / "gpuslice.yaml"), "-c", f"import time; time.sleep({job_seconds})"]
            hub.api("POST", "/users/bench")
            status, made = hub.api("POST", "/users/bench/tokens", {"note": "bench jobs"})
            if status != 201:
                raise RuntimeError(f"no token for the bench's user: HTTP {status} {made}")
            user = Hub.__new__(Hub)  # the same client, with the user's own token (the jobs API answers users)
            user.token, user.port = made["token"], hub.port
            for _ in range(runs):
                started = time.perf_counter()
                subprocess.run(command, check=True)
                direct.append(time.perf_counter() - started)
                started = time.perf_counter()
                status, answer = user.api("POST", "/gpuslice/jobs", {"command": command, "gpu_memory": "4GiB"})
                if status != 201:
                    raise RuntimeError(f"the job was refused: HTTP {status} {answer}")
                job_id = answer["job"]["id"]
                job = answer["job"]
                while job["state"] not in FINISHED:
                    time.sleep(0.05)
                    job = user.api("GET", f"/gpuslice/jobs/{job_id}")[1]["job"]
                if job["state"] != SUCCEEDED:  # a job that did not run its command is not a figure
                    raise RuntimeError(f"the job ended {job['state']}: {job}")
                through.append(time.perf_counter() - started)
        finally:
            hub.close()
    p50_through, p50_direct = statistics.median(through), statistics.median(direct)
    return {
        "job_seconds": job_seconds,
        "runs": runs,
        "through_platform_s": through,
        "direct_s": direct,
        "p50_ratio": p50_through / p50_direct,
        "fixed_overhead_s": p50_through - p50_direct,
    }


def report(result: dict[str, Any]) -> str:
    lines = ["gpuslice bench jobs"]
    if "overhead" in result:
        o = result["overhead"]
        lines.append(
            f"(1) a {o['job_seconds']:g} s job, {o['runs']} runs each: through the platform p50"
            f" {statistics.median(o['through_platform_s']):.2f} s, max {max(o['through_platform_s']):.2f} s;"
            f" directly p50 {statistics.median(o['direct_s']):.2f} s, max {max(o['direct_s']):.2f} s:"
            f" x{o['p50_ratio']:.3f} (target <= 1.15), fixed overhead {o['fixed_overhead_s']:.2f} s"
        )
    if "queue" in result:
        q = result["queue"]
        lines.append(
            f"(2) {q['jobs']} jobs from {q['users']} users queued at once on {q['cards']}, dispatched until all ran"
            f" ({q['looks']} looks): a decision for one job p50 {q['decision_per_job_ms']['p50']:.1f} ms, p99"
            f" {q['decision_per_job_ms']['p99']:.1f} ms (target < 20 ms); a look's decisions (every job it placed)"
            f" p50 {q['decision_ms']['p50']:.1f} ms, p99 {q['decision_ms']['p99']:.1f} ms;"
            f" a look with its ledger transaction p50"
            f" {q['look_ms']['p50']:.1f} ms, p99 {q['look_ms']['p99']:.1f} ms; CPU a look p50"
            f" {q['look_cpu_ms']['p50']:.1f} ms, p99 {q['look_cpu_ms']['p99']:.1f} ms:"
            f" {q['cpu_share_at_one_look_a_second']:.1%} of a core at one look a second"
        )
    if "night" in result:
        from bench.jobs_night import report as night_report

        lines.append(night_report(result["night"]))
    return "\n".join(lines)
