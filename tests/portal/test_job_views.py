"""The Jobs page's rows, from literal answers of the hub's jobs API."""

from datetime import UTC

from portal import job_views
from portal.data.jobs import JobInfo, job_info
from portal.data.prometheus import GpuReading
from spawner.shares import GiB


def info(**fields: object) -> JobInfo:
    base = {
        "id": 12,
        "user": "ann",
        "name": "train",
        "state": "queued",
        "reason": "waiting in line",
        "gpu": "4 GiB of one GPU",
        "image": "default",
        "priority": "normal",
        "submitted": 1_000.0,
    }
    return job_info({**base, **fields})


def test_a_queued_job_says_its_place_its_start_and_why() -> None:
    job = info(queue={"position": 3, "estimated_start": 1_600.0, "why": "2 request(s) are ahead of it"})
    words = job_views.detail(job, None, now=1_000.0, where=UTC)
    assert words == "#3 in line, expected 00:26 UTC (in 10 min): 2 request(s) are ahead of it"


def test_a_running_job_joins_its_own_processes_and_its_cards_readings() -> None:
    job = info(state="running", elapsed_s=125, placed="4 GiB of GPU 1 (T4, simulated)", cards=[1])
    memory = {("ann", "job:12"): 3 * GiB, ("ann", "job:13"): 9 * GiB, ("bob", "job:12"): 9 * GiB}
    readings = {("node", "0"): GpuReading(utilization_pct=90.0), ("node", "1"): GpuReading(utilization_pct=40.0)}
    gpu = job_views.job_gpu(job, memory, readings)
    assert gpu == job_views.JobGpu(3 * GiB, 40.0)
    assert job_views.detail(job, gpu, 0, UTC) == (
        "running 2 min, on 4 GiB of GPU 1 (T4, simulated), using 3 GiB of GPU memory, card 40% busy"
    )
    assert (
        job_views.detail(job, job_views.JobGpu(None, None), 0, UTC)
        == "running 2 min, on 4 GiB of GPU 1 (T4, simulated)"
    )


def test_a_finished_job_says_its_exit_code_and_the_reason() -> None:
    failed = info(state="failed", exit_code=1, reason="out of GPU memory (4 GiB of one GPU): exit code 1")
    assert job_views.detail(failed, None, 0, UTC).startswith("exit code 1: out of GPU memory")
    assert job_views.detail(info(state="cancelled", reason="cancelled by ann"), None, 0, UTC) == "cancelled by ann"


def test_rows_and_filters() -> None:
    jobs = [info(), info(id=13, state="running", name="eval", user="bob")]
    rows = job_views.job_rows(jobs, {}, now=1_000.0, where=UTC)
    assert [r["id"] for r in rows] == [12, 13] and rows[1]["name"] == "eval"
    assert [j.id for j in jobs if job_views.job_matches(j, {"running"}, "")] == [13]
    assert [j.id for j in jobs if job_views.job_matches(j, set(), "BOB")] == [13]


def test_a_jobs_output_is_shown_as_text_never_as_terminal_escapes() -> None:
    shown = job_views.printable(b"\x1b[31mred\x1b[0m <script>alert(1)</script>\r\n\xff done")
    assert "\x1b" not in shown and "\r" not in shown and "<script>alert(1)</script>" in shown and "\ufffd done" in shown
