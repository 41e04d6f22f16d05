"""The Jobs and New job pages with AppTest: the jobs API faked (the hub's own checks are tests/e2e/test_jobs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from market.store import Image, Store
from portal.data.jobs import JobEvent, JobInfo, job_info
from portal.identity import Identity
from portal.job_views import JobGpu
from portal.sources import jobs, markets
from tests.portal.test_pages import fakes, run, texts  # noqa: F401  (fakes is a fixture)

INJECTED = "**bold** <script>alert(1)</script> [link](javascript:alert(2))\x1b[31m red"


def field(at: Any, label: str) -> Any:
    return next(t for t in at.text_input if t.label.startswith(label))


def job(**fields: Any) -> JobInfo:
    base = {
        "id": 3,
        "user": "alice",
        "name": "train <b>it</b>",
        "state": "running",
        "reason": "running",
        "gpu": "4 GiB of one GPU",
        "image": "default",
        "priority": "normal",
        "submitted": 1_000.0,
        "started": 1_010.0,
        "elapsed_s": 70,
        "placed": "4 GiB of GPU 0 (T4, simulated)",
        "cards": [0],
        "spec": {"command": ["python", "train.py"], "time_limit": "1h"},
    }
    return job_info({**base, **fields})


@pytest.fixture
def hub_jobs(fakes: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:  # noqa: F811
    state: dict[str, Any] = {
        "jobs": [job(), job(id=4, user="bob", state="queued", reason="waiting", queue={"position": 1, "why": "x"})],
        "asked": [],
    }

    def listed(identity: Identity) -> list[JobInfo]:
        return [j for j in state["jobs"] if identity.admin or j.user == identity.name or identity.name == "tina"]

    def one(identity: Identity, job_id: int) -> tuple[JobInfo, list[JobEvent]]:
        found = next(j for j in listed(identity) if j.id == job_id)
        return found, [JobEvent("queued", f"submitted by {found.user}", 1_000.0)]

    def tail(identity: Identity, job_id: int) -> tuple[bytes, int]:
        state["asked"].append(("log", identity.name, job_id))
        return INJECTED.encode(), len(INJECTED)

    def submit(identity: Identity, spec: dict[str, Any]) -> JobInfo:
        state["asked"].append(("submit", identity.name, spec))
        if spec.get("time_limit") == "soon":
            raise ValueError("time_limit must be a duration such as 2h, 90min or 3600 (seconds), not 'soon'")
        return job(id=9, state="queued", user=identity.name)

    monkeypatch.setattr(jobs, "jobs", listed)
    monkeypatch.setattr(jobs, "job", one)
    monkeypatch.setattr(jobs, "log_tail", tail)
    monkeypatch.setattr(jobs, "gpu_use", lambda running: {j.id: JobGpu(3 * 2**30, 55.0) for j in running})
    monkeypatch.setattr(jobs, "submit", submit)
    store = Store(f"sqlite:///{tmp_path / 'market.sqlite'}")
    store.migrate()
    store.save_image(Image("default", "Python", "1", "python"), actor="root")
    monkeypatch.setattr(markets, "market", lambda: store)
    return state


def test_the_jobs_page_lists_each_job_with_what_it_does(fakes: dict[str, object], hub_jobs: dict[str, Any]) -> None:  # noqa: F811
    at = run("screens/jobs.py")
    assert at.title[0].value == "Jobs"
    table = at.dataframe[0].value
    assert list(table["id"]) == [3, 4] and table["name"][0] == "train <b>it</b>"  # a cell shows it as text
    assert "using 3 GiB of GPU memory, card 55% busy" in table["detail"][0]
    assert table["detail"][1] == "#1 in line: x"


def test_the_chosen_jobs_detail_is_read_as_the_hub_says_now_not_as_the_table_had_it(
    fakes: dict[str, object],  # noqa: F811
    hub_jobs: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The detail re-reads the job: one that ended after the table was read shows its end, and no Cancel."""
    fakes["identity"] = Identity("alice")
    ended = job(state="succeeded", reason="exit code 0", elapsed_s=90)
    monkeypatch.setattr(jobs, "job", lambda identity, job_id: (ended, [JobEvent("succeeded", "exit code 0", 1_100.0)]))
    at = run("screens/jobs.py")
    assert at.dataframe[0].value["state"][0] == "running"  # the table's read
    assert "succeeded" in list(at.dataframe[1].value["state"])  # the detail's own, later read
    assert "Cancel" not in [b.label for b in at.button]


def test_a_jobs_output_is_shown_as_text_to_its_owner(fakes: dict[str, object], hub_jobs: dict[str, Any]) -> None:  # noqa: F811
    fakes["identity"] = Identity("alice")
    at = run("screens/jobs.py")
    shown = [c.value for c in at.code]
    assert any("<script>alert(1)</script>" in c and "**bold**" in c for c in shown)  # in a code block: inert
    assert not any("<script>" in str(m.value) for m in at.markdown)  # never as markdown or HTML
    assert not any("\x1b" in c for c in shown)
    assert ("log", "alice", 3) in hub_jobs["asked"]


def test_a_jobs_name_is_shown_as_its_owner_wrote_it_never_rendered(
    fakes: dict[str, object],  # noqa: F811
    hub_jobs: dict[str, Any],
) -> None:
    hub_jobs["jobs"][0] = job(name=INJECTED)
    fakes["identity"] = Identity("alice")
    at = run("screens/jobs.py")
    heading = at.subheader[0].value
    assert heading.startswith("Job 3\\: ") and "\\*\\*bold\\*\\*" in heading
    assert "<script>" not in heading and "](javascript:" not in heading and "**bold**" not in heading


def test_a_teacher_sees_the_job_but_not_its_output(fakes: dict[str, object], hub_jobs: dict[str, Any]) -> None:  # noqa: F811
    fakes["identity"] = Identity("tina")
    at = run("screens/jobs.py")
    assert "A job's output is for its owner and admins." in texts(at)
    assert not any(a[0] == "log" for a in hub_jobs["asked"])


def test_new_job_submits_with_the_readers_token_and_shows_the_hubs_refusal(
    fakes: dict[str, object],  # noqa: F811
    hub_jobs: dict[str, Any],
) -> None:
    fakes["identity"] = Identity("alice")
    at = run("screens/new_job.py")
    field(at, "Command").input("python train.py --lr '1e-3'")  # split as a shell would
    field(at, "Time limit").input("soon")
    at.button[0].click().run()
    assert "Not submitted: time_limit must be a duration" in texts(at)
    submitted = hub_jobs["asked"][-1]
    assert submitted[0] == "submit" and submitted[1] == "alice"
    assert submitted[2]["command"] == ["python", "train.py", "--lr", "1e-3"] and "user" not in submitted[2]
    field(at, "Time limit").input("2h")
    at.button[0].click().run()
    assert "Submitted as job 9" in texts(at)
