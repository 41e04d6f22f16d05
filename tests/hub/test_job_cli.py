"""`gpuslice job`: what it asks the hub, and how it prints the answers."""

import argparse

import pytest

from hub import cli, job_cli


def parsed(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["job", *argv])


def test_submit_turns_the_command_line_into_the_apis_body() -> None:
    args = parsed(
        "submit",
        "--gpu",
        "4GiB",
        "--image",
        "pytorch",
        "--env",
        "SEED=1",
        "--model",
        "langid-97",
        "--time-limit",
        "2h",
        "--retries",
        "2",
        "--backfill",
        "--cpus",
        "2",
        "--memory",
        "8GiB",
        "--",
        "python",
        "train.py",
        "--epochs",
        "3",
    )
    assert job_cli.spec_of(args) == {
        "name": "",
        "image": "pytorch",
        "gpu_memory": "4GiB",
        "gpus": 0,
        "env": {"SEED": "1"},
        "models": ["langid-97"],
        "time_limit": "2h",
        "retries": 2,
        "priority": "backfill",
        "cpus": 2.0,
        "memory": "8GiB",
        "command": ["python", "train.py", "--epochs", "3"],
    }
    assert args.command == "job" and args.job_command == "submit"  # the program is not taken for gpuslice's command
    notebook = job_cli.spec_of(parsed("submit", "--notebook", "work/train.ipynb", "--gpu", "4GiB"))
    assert notebook["notebook"] == "work/train.ipynb" and "command" not in notebook
    with pytest.raises(job_cli.JobClientError, match="NAME=VALUE"):
        job_cli.spec_of(parsed("submit", "--env", "SEED", "--", "true"))


def test_without_a_token_it_says_where_to_put_one(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(job_cli.JobClientError, match="no token: make one on the hub's Token page"):
        job_cli.client_of(parsed("--url", "http://hub:8000", "ls"))
    (tmp_path / ".config" / "gpuslice").mkdir(parents=True)
    (tmp_path / ".config" / "gpuslice" / "token").write_text("abc\n")
    client = job_cli.client_of(parsed("--url", "http://hub:8000/", "ls"))
    assert client.api_url == "http://hub:8000/hub/api" and client.session.headers["Authorization"] == "token abc"
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "from-the-terminal")
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")
    inside = job_cli.client_of(parsed("ls"))
    assert inside.api_url == "http://127.0.0.1:8081/hub/api"
    assert inside.session.headers["Authorization"] == "token from-the-terminal"


def test_ls_lines_say_what_each_job_does() -> None:
    job = {
        "id": 7,
        "user": "ann",
        "state": "queued",
        "gpu": "4 GiB of one GPU",
        "name": "train",
        "queue": {"position": 2, "estimated_start": None, "why": "1 request(s) are ahead of it"},
        "reason": "",
        "placed": "",
        "elapsed_s": None,
    }
    assert job_cli.line_of(job, 0).endswith("#2 in line: 1 request(s) are ahead of it")
    done = {**job, "state": "failed", "reason": "time limit: stopped after 1 h", "queue": None}
    assert job_cli.line_of(done, 0).endswith("time limit: stopped after 1 h")
