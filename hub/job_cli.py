"""`gpuslice job ...`: batch jobs from the command line, through the hub's jobs API with the user's own token.

    gpuslice job submit --gpu 4GiB --image pytorch -- python train.py
    gpuslice job submit --notebook work/train.ipynb --gpu 4GiB --wait
    gpuslice job ls | show ID | logs ID [--follow] | cancel ID | resubmit ID

The token (yours: the hub's Token page makes one) is read from ``--token-file FILE``, else from the
``JUPYTERHUB_API_TOKEN`` variable (every JupyterLab terminal has it), else from
``~/.config/gpuslice/token``. The hub is ``--url`` (its public address, http://HOST:8000), else the
``JUPYTERHUB_API_URL`` a JupyterLab terminal has, else this machine's from the settings. The hub
decides what the token may do (hub/jobs_api.py): the command line only asks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import requests

from hub import settings as settings_mod
from spawner import environ

TOKEN_FILE = Path(".config") / "gpuslice" / "token"  # under the home folder
FINISHED = ("succeeded", "failed", "cancelled")


def clock(stamp: float) -> str:
    """A time of day in this machine's clock, for a terminal."""
    return time.strftime("%H:%M:%S", time.localtime(stamp))


class JobClientError(RuntimeError):
    """The hub refused or could not be reached; the message is the hub's, or says what to do."""


class JobClient:
    """The jobs API, with one user's token."""

    def __init__(self, api_url: str, token: str, session: requests.Session | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(method, f"{self.api_url}/gpuslice/jobs{path}", timeout=60, **kwargs)
        except requests.RequestException as exc:
            raise JobClientError(f"the hub at {self.api_url} did not answer ({exc}); is --url right?") from exc
        if response.status_code >= 400:
            raise JobClientError(f"HTTP {response.status_code}: {_message(response)}")
        return response

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", "", json=spec).json()["job"])

    def jobs(self, states: Iterable[str] = (), user: str = "") -> list[dict[str, Any]]:
        query = {k: v for k, v in (("state", ",".join(states)), ("user", user)) if v}
        return list(self._call("GET", "", params=query).json()["jobs"])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/{job_id}").json())

    def log(self, job_id: int, offset: int = 0) -> tuple[bytes, int]:
        """The log from ``offset``, and its size now."""
        response = self._call("GET", f"/{job_id}/log", params={"offset": offset})
        return response.content, int(response.headers.get("X-Log-Size", "0"))

    def act(self, job_id: int, action: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/{job_id}/{action}").json()["job"])


def _message(response: requests.Response) -> str:
    try:
        return str(response.json().get("message") or response.text)
    except ValueError:
        return response.text[:500]


def add_command(commands: Any) -> None:
    job = commands.add_parser("job", help="batch jobs on GPU slices: submit, ls, show, logs, cancel, resubmit")
    job.add_argument("--url", help="the hub, as http://HOST:PORT (default: $JUPYTERHUB_API_URL, else this machine's)")
    job.add_argument(
        "--token-file",
        type=Path,
        help=f"a file holding your API token (default: ${environ.HUB_API_TOKEN.name}, else ~/{TOKEN_FILE})",
    )
    job.add_argument("--config", type=Path, help="settings file, for this machine's hub port")
    sub = job.add_subparsers(dest="job_command", required=True)
    submit = sub.add_parser("submit", help="submit a job: gpuslice job submit --gpu 4GiB -- python train.py")
    submit.add_argument("--name", default="", help="what to call it")
    submit.add_argument("--gpu", default="0", help='a slice as for a server: "4GiB", "0.25", "0" for CPU only')
    submit.add_argument("--gpus", type=int, default=0, help="whole cards instead of a slice")
    submit.add_argument("--image", default="default", help="an image of the image market (default: default)")
    submit.add_argument("--cpus", type=float, help="CPU cores (a quota)")
    submit.add_argument("--memory", help='memory, for example "8GiB" (default: the class\'s limit)')
    submit.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable")
    submit.add_argument("--model", action="append", default=[], help="a model of the market, mounted read-only")
    submit.add_argument("--time-limit", default="1h", help="stopped after this long: 2h, 90min, 3600 (default 1h)")
    submit.add_argument("--retries", type=int, default=0, help="run again this many times if it fails")
    submit.add_argument("--backfill", action="store_true", help="run on slices nobody waits for; yields to people")
    submit.add_argument("--notebook", help="run this notebook (a path in your home) instead of a command")
    submit.add_argument("--wait", action="store_true", help="follow its output until it ends; exit with its code")
    submit.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")  # not "command": gpuslice's
    ls = sub.add_parser("ls", help="your jobs (a teacher's: their classes'; an admin's: all)")
    ls.add_argument("--state", action="append", default=[], help="only jobs in this state (repeatable)")
    ls.add_argument("--user", default="", help="only this user's jobs")
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = sub.add_parser("show", help="one job and what happened to it")
    show.add_argument("id", type=int)
    show.add_argument("--json", action="store_true", help="print JSON")
    logs = sub.add_parser("logs", help="a job's output")
    logs.add_argument("id", type=int)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    for name in ("cancel", "resubmit"):
        action = sub.add_parser(name, help=f"{name} a job")
        action.add_argument("id", type=int)


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """The job's spec (hub/jobs_api.py's body) from ``submit``'s arguments."""
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    env = {}
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep:
            raise JobClientError(f"--env takes NAME=VALUE, not {pair!r}")
        env[name] = value
    spec: dict[str, Any] = {
        "name": args.name,
        "image": args.image,
        "gpu_memory": args.gpu,
        "gpus": args.gpus,
        "env": env,
        "models": args.model,
        "time_limit": args.time_limit,
        "retries": args.retries,
        "priority": "backfill" if args.backfill else "normal",
    }
    if args.cpus is not None:
        spec["cpus"] = args.cpus
    if args.memory:
        spec["memory"] = args.memory
    if args.notebook:
        spec["notebook"] = args.notebook
    if command:
        spec["command"] = command
    return spec


def client_of(args: argparse.Namespace) -> JobClient:
    env = environ.read()
    if args.url:
        api = f"{args.url.rstrip('/')}/hub/api"
    elif env.values.get(environ.HUB_API_URL.name):
        api = env.get(environ.HUB_API_URL)
    else:
        settings = settings_mod.load(settings_mod.config_path(args.config))
        api = f"http://127.0.0.1:{settings.port}/hub/api"
    token = args.token_file.read_text().strip() if args.token_file else env.get(environ.HUB_API_TOKEN)
    default = Path.home() / TOKEN_FILE
    if not token and default.exists():
        token = default.read_text().strip()
    if not token:
        raise JobClientError(
            f"no token: make one on the hub's Token page and give --token-file, set "
            f"{environ.HUB_API_TOKEN.name}, or put it in ~/{TOKEN_FILE}"
        )
    return JobClient(api, token)


def line_of(job: dict[str, Any], now: float) -> str:
    """One job in a line of text, as `ls` prints it."""
    state = job["state"]
    queue = job.get("queue") or {}
    if state == "queued" and queue:
        eta = f", expected {clock(queue['estimated_start'])}" if queue.get("estimated_start") else ""
        detail = f"#{queue['position']} in line{eta}: {queue.get('why', '')}"
    elif state in FINISHED:
        detail = job["reason"]
    else:
        elapsed = f"{int(job['elapsed_s'])} s" if job.get("elapsed_s") is not None else ""
        detail = f"{elapsed} on {job['placed'] or 'no GPU'}" if state == "running" else job["reason"]
    return f"{job['id']:>5}  {job['user']:<12} {state:<10} {job['gpu']:<22} {job['name'][:30]:<30} {detail}"


def _follow(client: JobClient, job_id: int, out: Any) -> dict[str, Any]:
    """Print the job's output as it comes, until it ends; the job as it ended."""
    offset = 0
    while True:
        job: dict[str, Any] = client.job(job_id)["job"]
        data, size = client.log(job_id, offset)
        if data:
            out.write(data.decode(errors="replace"))
            out.flush()
            offset += len(data)
        if job["state"] in FINISHED and offset >= size:
            return job
        time.sleep(1.0)


def run(args: argparse.Namespace, out: Any = sys.stdout) -> int:
    try:
        return _run(args, client_of(args), out)
    except JobClientError as exc:
        print(f"gpuslice job: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, client: JobClient, out: Any) -> int:
    command = args.job_command
    if command == "submit":
        job = client.submit(spec_of(args))
        print(f"job {job['id']} {job['state']}: {job['name']} ({job['gpu']})", file=out)
        if args.wait:
            ended = _follow(client, job["id"], out)
            print(f"job {ended['id']} {ended['state']}: {ended['reason']}", file=out)
            return int(ended["exit_code"] or 0) if ended["state"] != "cancelled" else 1
        return 0
    if command == "ls":
        jobs = client.jobs(args.state, args.user)
        if args.json:
            print(json.dumps(jobs, indent=2), file=out)
        else:
            now = time.time()
            print(f"{'ID':>5}  {'USER':<12} {'STATE':<10} {'GPU':<22} {'NAME':<30} DETAIL", file=out)
            for job in jobs:
                print(line_of(job, now), file=out)
        return 0
    if command == "show":
        found = client.job(args.id)
        if args.json:
            print(json.dumps(found, indent=2), file=out)
        else:
            print(line_of(found["job"], time.time()), file=out)
            for event in found["events"]:
                print(f"  {clock(event['at'])}  {event['state']:<10} {event['message']}", file=out)
        return 0
    if command == "logs":
        if args.follow:
            _follow(client, args.id, out)
        else:
            out.write(client.log(args.id)[0].decode(errors="replace"))
        return 0
    job = client.act(args.id, command)
    print(f"job {job['id']} {job['state']}: {job['reason']}", file=out)
    return 0
