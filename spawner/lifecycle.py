"""The local backend's lifecycle: the slice held in the SQLite ledger from start to clear_state.

``LedgerGpuMixin`` (the base of ``spawner.local.LocalGpuSpawner``) places the slice and
writes it to the ledger before the server process exists, records each step as a server
event, and releases the slice however the server ends. ``RestartCheck`` (the first poll after a
hub restart) is shared with the Kubernetes backend (``spawner.kube``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any

import aiohttp
from traitlets import Instance, Integer, Unicode

from spawner import environ, metrics
from spawner.assets import HOOK_DIR, LAB_DIR
from spawner.card_health import CardLedger
from spawner.holds import placement_rows
from spawner.inventory import Inventory, build_local
from spawner.ledger import Held, ServerProcess, stop_message
from spawner.line import WAITING_PROGRESS, LogRead, WaitingLineMixin, usage_of
from spawner.patrol import with_health
from spawner.placement import Choice, Demand
from spawner.processes import Proc, identify, running
from spawner.quotas import Usage
from spawner.request import GpuRefused
from spawner.shares import GpuRequest, format_bytes
from spawner.sharing.base import ServerGpuSpec, Target
from spawner.sharing.local import Local
from spawner.start_turns import START_TURN_MAX_WAIT_S, START_TURN_PROGRESS, machine_turns, turn_words
from spawner.waitline import activity_report_interval


class RestartCheck:
    """The first poll after a hub restart, for every backend (local processes and Kubernetes pods).

    A spawner the hub loaded from its database (it restarted while the server ran or started)
    has not been ``started()`` by this hub process: its first poll that finds the server alive
    waits with ``answer_or_exit`` until the server answers, exits, or stays silent for the
    ``timeout``. A server that was starting while the hub was down gives up on reaching the hub
    after about 45 s and exits; without this check it stays "pending" and holds its slice for
    the whole ``http_timeout``. Later polls are JupyterHub's usual ones.
    """

    def __init__(self) -> None:
        self.checked = False  # this hub process started the server, or has checked it since it restarted
        self.silent = False  # the check found it alive but silent: the poll said -1 so JupyterHub stops it

    def started(self) -> None:
        """This hub process starts the server and watches the start itself."""
        self.checked, self.silent = True, False

    def due(self, status: int | None) -> bool:
        """Whether this poll is the first look at a server this hub process did not start, and it looks alive."""
        return status is None and not self.checked

    async def check(
        self, url: str, poll: Callable[[], Awaitable[int | None]], timeout: float, log: Any, name: str
    ) -> int | None:
        """What the first poll after a restart reports: None (it answers), its exit status, or -1 (silent)."""
        self.checked = True
        status, silent = await answer_or_exit(url, poll, timeout)
        if silent:
            log.warning("gpuslice: %s did not answer at %s within %s s after the hub restarted", name, url, timeout)
            self.silent = True
            return -1
        return status


class LedgerGpuMixin(WaitingLineMixin):
    """The local backend's lifecycle: the slice is placed here and held in the SQLite ledger.

    On ``start`` it checks the request and the group quotas, places the slice with the
    core's policy and writes it to the ledger, all before the server process exists; it
    releases the slice however the server ends (JupyterHub calls ``clear_state`` for
    each). Each step is recorded as a server event, so the portal can say why a server
    waits or why it failed.
    """

    _gpu_restart = Instance(RestartCheck, args=(), help="The first poll after a hub restart (one per spawner).")
    _gpu_process: ServerProcess | None = None  # the server's process as the ledger records it
    _gpu_adopted = False  # its process came from the ledger: the hub was killed before it recorded it
    _gpu_unit = ""  # the cgroup or systemd scope the server runs in ("" for none: spawner/confinement.py)

    gpu_kernel_hook_dir = Unicode(
        str(HOOK_DIR),
        help="The folder on notebooks' PYTHONPATH: the kernel hook (under isolation unix-users, "
        "a copy every account can read: hub/userenv.py).",
    ).tag(config=True)
    gpu_concurrent_starts = Integer(
        0,
        help="Servers that start at once on this machine; the others wait their turn, told their place "
        "(spawner/start_turns.py). 0: all start at once.",
    ).tag(config=True)
    gpu_start_turn_max_wait = Integer(
        START_TURN_MAX_WAIT_S,
        help="Longest a server waits for its turn to start (seconds); its start then fails, saying so. "
        "start_timeout is raised by this much where servers take turns.",
    ).tag(config=True)
    gpu_lab_dir = Unicode(
        str(LAB_DIR),
        help="The folder on notebooks' JUPYTER_PATH and JUPYTER_CONFIG_PATH: JupyterLab's reclaim notice and "
        "the server config that counts only use as activity (under isolation unix-users, "
        "a copy every account can read: hub/userenv.py).",
    ).tag(config=True)

    def _inventory(self, holds: list[Held]) -> Inventory:
        # A card whose patrol failed is out of placement until an admin clears it (spawner/patrol.py).
        gpus = with_health(self._machine.gpus, CardLedger(self.gpu_ledger_path).out_of_placement())
        return build_local(gpus, [(h.gpu_index, h.allocation()) for h in holds])

    def form_state(self) -> tuple[Inventory, Usage]:
        others = [h for h in self._ledger.holdings() if h.key != self._key]
        return self._inventory(others), usage_of(others, self.user.name)  # type: ignore[attr-defined]

    # -- the decision, inside the ledger's transaction ----------------------------------

    def _decide(self, request: GpuRequest, image: str, holds: list[Held]) -> list[Held]:
        inventory = self._inventory(holds)
        usage = usage_of(holds, self.user.name)  # type: ignore[attr-defined]
        group, choice = self.check_and_place(
            request, image, inventory, usage, [Demand.held(h.whole, h.memory_bytes) for h in holds]
        )
        return self._rows(request, inventory, group, choice)

    def _rows(self, request: GpuRequest, inventory: Inventory, group: str | None, choice: Choice | None) -> list[Held]:
        """The ledger rows for a placement (none for CPU only)."""
        return placement_rows(self._key, self.name, request, inventory, group, choice)  # type: ignore[attr-defined]

    def allocate(self) -> tuple[GpuRequest, list[Held] | None]:
        """Check and place the request; write it to the ledger. Counts refusals.

        With ``wait`` the request joins the line instead of being refused for room or
        budget: the holds are then None and ``start`` waits for its turn.
        """
        self._gpu_stages = []
        self._gpu_request = None
        try:
            request, image = self.gpu_request()
            self._gpu_request = (request, image)
            self._gpu_models = self.gpu_model_folders()
            self._record("requested", 10, f"asked for {request.describe()} with image {image}")
            self._stage(10, f"asked for {request.describe()} with image {image}")
            holds = self._take_turn(request, image, self._wants_to_wait())
        except GpuRefused as refusal:
            self._refused(refusal)
            raise
        return request, holds

    def _spec_for(self, request: GpuRequest, holds: list[Held]) -> ServerGpuSpec:
        if not holds:
            return Local().render(request)
        by_index = {g.index: g for g in self._machine.gpus}
        cards = [by_index[h.gpu_index] for h in holds]
        devices = tuple(g.uuid if not g.simulated else str(g.index) for g in cards)
        return Local().render(request, Target(card_bytes=cards[0].memory_bytes, devices=devices))

    # -- the spawner lifecycle ----------------------------------------------------------

    async def start(self) -> Any:
        request, holds = self.allocate()
        if holds is None:
            assert self._gpu_request is not None  # allocate() set it
            holds = await self._wait_in_line(*self._gpu_request)
        self._gpu_holds = holds
        self._gpu_spec = self._spec_for(request, holds)
        placed = self.placement_text() or "no GPU"
        self.log.info("gpuslice: %s gets %s: %s", self._key, request.describe(), placed)  # type: ignore[attr-defined]
        self._record("placed", 20, f"placed: {placed}; starting the server")
        self._stage(20, f"GPU placed: {placed}")
        self._gpu_starting = True
        self._gpu_restart.started()
        try:
            self.prepare_home()
            self._stage(35, "home folder ready")
            self.prepare_server()
            models = ", ".join(self._gpu_models or {})
            self._stage(50, f"models mounted in ~/models: {models}" if models else "no models to mount")
            async with self._start_turn():
                result = await super().start()  # type: ignore[misc]
                self._remember_process(result)
                pid = getattr(self, "pid", 0)
                started = f"server process started{f' (pid {pid})' if pid else ''}; waiting for it to answer"
                self._record("started", 50, started)
                self._stage(70, started)
                await self._first_answer(result)
        except BaseException as exc:
            self._ledger.release(self._key)
            self._gpu_holds = None
            self._record("failed", 100, f"the server did not start: {exc or type(exc).__name__}")
            raise
        finally:
            self._gpu_starting = False
        return result

    def _start_turn(self) -> AbstractAsyncContextManager[Any]:
        """Held from the server's launch to its first answer: with ``gpu_concurrent_starts``, the server waits
        here for its turn while that many start (spawner/start_turns.py), so ``http_timeout`` counts from it."""
        if not self.gpu_concurrent_starts:
            return nullcontext()
        turns = machine_turns(self.gpu_concurrent_starts)
        metrics.follow_turns(lambda: turns.starting, lambda: turns.waiting)
        recorded = False

        def tell(ahead: int) -> None:
            nonlocal recorded
            words = turn_words(ahead, turns.limit)
            if not recorded:  # the Servers page says why it waits; its place changing is for the student's page
                self._record("waiting", START_TURN_PROGRESS, words)
                recorded = True
            self._stage(START_TURN_PROGRESS, words)

        return turns.turn(tell, self.gpu_start_turn_max_wait)

    def _start_turn_allowance(self) -> int:
        return self.gpu_start_turn_max_wait if self.gpu_concurrent_starts else 0

    def _remember_process(self, started: Any) -> None:
        """Record the new server's process in the ledger at once, before it answers.

        JupyterHub writes the process id to its database only when start() returns, which is
        after the server's first answer here: a hub killed in between (a class pressing Start
        together can take minutes to answer) would leave a server nobody knows of. With this
        record the restarted hub adopts it (``poll``), or the next `gpuslice up` stops it
        (hub/recovery.py). Nothing to record for a process that has already ended.
        """
        pid = getattr(self, "pid", 0)
        proc = identify(pid) if pid else None
        if proc is not None:
            address = _address(started, self.server)  # type: ignore[attr-defined]
            self._gpu_process = ServerProcess(self._key, proc.pid, proc.started, address, self._gpu_unit)
            self._ledger.add_process(self._gpu_process)

    async def _first_answer(self, started: Any) -> None:
        """Wait here, not only in JupyterHub's wait after start(), for the server's first answer.

        The progress stream ends the moment the spawn does: a "server answering" stage noticed
        after JupyterHub's own check would never be shown. Raises when the server exits first
        or stays silent for ``http_timeout`` (the slice is then released like any failed start).
        """
        url = f"{_address(started, self.server)}{self.server.base_url}api"  # type: ignore[attr-defined]
        timeout = self.http_timeout  # type: ignore[attr-defined]
        status, silent = await answer_or_exit(url, super().poll, timeout, interval=0.2)  # type: ignore[misc]
        if status is not None:
            raise RuntimeError(f"the server exited with status {status} before it answered (see the hub's log)")
        if silent:
            raise TimeoutError(f"the server did not answer within {timeout} s")
        self._stage(90, "server answering")

    def prepare_home(self) -> None:
        """Called after the slice is held: make the user's home folder (a backend knows where)."""

    def prepare_server(self) -> None:
        """Called after the slice is held, before the server starts (a backend mounts models here)."""

    async def poll(self) -> int | None:
        if not self._gpu_restart.checked and not getattr(self, "pid", 0):
            self._adopt_recorded_process()
        status: int | None = await super().poll()  # type: ignore[misc]
        if self._gpu_restart.due(status):  # the hub's first look at a server it did not start
            url, timeout = f"{await self.get_url()}api", self.http_timeout  # type: ignore[attr-defined]
            status = await self._gpu_restart.check(url, super().poll, timeout, self.log, self._key)  # type: ignore[misc, attr-defined]
        if status is None and self._gpu_holds:
            # Running: make sure the ledger still holds the slice (it may have been lost). A read
            # on every poll; the write lock only when something must be put back.
            missing = self._ledger.missing(self._gpu_holds)
            if missing:
                self._ledger.restore(missing)
        running_events = ("started", "warned")  # "warned": the reclaimer's notice to a running server
        if status is not None and not self._gpu_restart.silent and self._last_event_kind() in running_events:
            # Nobody stopped it (stop() records "stopped"): it crashed, exited or was killed.
            self._record("died", 100, _died_message(status))
        return status

    def _adopt_recorded_process(self) -> None:
        """The hub was killed after the server's process started and before it recorded it:
        take the process (and its address and slice) from the ledger, for JupyterHub to check as
        any server that ran through a restart. Only for a server the hub believes started."""
        if getattr(self, "server", None) is None:
            return
        ours = [p for p in self._ledger.processes() if p.key == self._key and running(Proc(p.pid, p.started))]
        if not ours:
            return
        self._gpu_process, self._gpu_adopted = ours[-1], True
        self.pid, self._gpu_unit = ours[-1].pid, ours[-1].unit
        self._gpu_holds = self._gpu_holds or [h for h in self._ledger.holdings() if h.key == self._key] or None
        self.log.info(  # type: ignore[attr-defined]
            "gpuslice: %s: its server (pid %s) started while the hub was killed; checking it", self._key, self.pid
        )

    async def get_url(self) -> str:
        """Where the server listens: JupyterHub asks after a restart; an adopted server's is in the ledger."""
        if self._gpu_adopted and self._gpu_process is not None:
            return f"{self._gpu_process.url}{self.server.base_url}"  # type: ignore[attr-defined]
        return str(self.server.url)  # type: ignore[attr-defined]

    async def stop(self, now: bool = False) -> None:
        self._record(*self._stop_reason())
        await super().stop(now=now)  # type: ignore[misc]

    def _stop_reason(self) -> tuple[str, int, str]:
        # JupyterHub stops a server it gave up on from inside start or the wait for it to answer.
        if self._gpu_restart.silent:
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s after the hub restarted"
        if self._gpu_starting:
            timeout = self.start_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not start within {timeout} s"
        if getattr(self, "_waiting_for_response", False):
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s"
        history = self._ledger.history(self._key)
        last = history[-1] if history else None
        message = stop_message(last, time.time(), self._last_activity_ts(), self.gpu_culler_timeout)
        return "stopped", 100, message

    def _last_event_kind(self) -> str | None:
        history = self._ledger.history(self._key)
        return history[-1].kind if history else None

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()  # type: ignore[misc]
        if self._gpu_spec is not None:
            env.update(self._gpu_spec.env)
        # Only the kernel hook: the hub's own PYTHONPATH (the platform's source tree) would let
        # our hub, portal and spawner packages shadow a user's packages of the same names.
        env["PYTHONPATH"] = self.gpu_kernel_hook_dir
        # JupyterLab finds the reclaim notice's prebuilt extension there (and the user's own dirs after it),
        # and jupyter_server the config that counts only use as activity, not an open page's polls.
        env["JUPYTER_PATH"] = self.gpu_lab_dir
        env["JUPYTER_CONFIG_PATH"] = self.gpu_lab_dir
        # JupyterHub's single-user server reports its activity this often (300 s by default, longer
        # than the reclaim warning): a use during the warning reaches the hub before the stop.
        env["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(activity_report_interval(self.gpu_warning_lead))
        if self._machine.simulated and self._gpu_holds:
            env[environ.SIMULATED.name] = "1"
        if self._gpu_models:
            env[environ.MODELS.name] = ",".join(self._gpu_models)
        return env

    async def gpu_job_log(self, job: Any, read: LogRead) -> tuple[bytes, int]:
        """A job's log file (DATA/jobs/ID/output.log, written by its runner)."""
        path = Path(self.gpu_ledger_path).absolute().parent / "jobs" / str(job.id) / "output.log"
        try:
            with path.open("rb") as log:
                size = os.fstat(log.fileno()).st_size
                start, length = read.window(size)
                log.seek(start)
                return log.read(-1 if length is None else length), size
        except FileNotFoundError:
            return b"", 0

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()  # type: ignore[misc]
        if self._gpu_holds:
            state["gpuslice_holds"] = [h.__dict__ for h in self._gpu_holds]
        if self._gpu_unit:
            state["gpuslice_unit"] = self._gpu_unit
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        self._gpu_holds = [Held(**h) for h in state.get("gpuslice_holds", [])] or None
        self._gpu_unit = str(state.get("gpuslice_unit", ""))

    def clear_state(self) -> None:
        # Every way a server ends passes here: stopped, died (JupyterHub skips stop()
        # for a dead server), culled, failed to start, or found dead after a restart.
        super().clear_state()  # type: ignore[misc]
        self._ledger.release(self._key)
        self._forget_ended_processes()
        # Not the line: a place survives a hub restart (the new hub clears the spawn it lost);
        # a waiting spawn that ends in this hub leaves the line itself (_wait_in_line).
        self._gpu_holds = None

    def _forget_ended_processes(self) -> None:
        """Drop the ledger's records of this server's processes that have ended (one still
        running, which a stop could not end, stays for the next `gpuslice up` to stop)."""
        for process in self._ledger.processes():
            if process.key == self._key and not running(Proc(process.pid, process.started)):
                self._ledger.forget_process(process)
        self._gpu_process, self._gpu_adopted = None, False

    def placement_text(self) -> str:
        if not self._gpu_holds:
            return ""
        by_index = {g.index: g for g in self._machine.gpus}
        parts = []
        for h in self._gpu_holds:
            gpu = by_index[h.gpu_index]
            label = f"GPU {gpu.index} ({gpu.model}{', simulated' if gpu.simulated else ''})"
            parts.append(f"{label}" if h.whole else f"{format_bytes(h.memory_bytes)} of {label}")
        return ", ".join(parts)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Each stage of the start as it happens, with how long it took, up to the first answer.

        JupyterHub stops reading when the spawn ends and sends its own "ready" event (100%):
        start() records "server answering" before it returns, and the stage wakes this
        generator at once, so the stage is sent before the spawn can end.
        The isolation warning comes once: here, unless the form already showed it.
        """
        added = asyncio.Event()
        if self._gpu_stage_listeners is None:
            self._gpu_stage_listeners = set()
        self._gpu_stage_listeners.add(added)
        try:
            async for event in self._stage_events(added):
                yield event
        finally:
            self._gpu_stage_listeners.discard(added)

    async def _stage_events(self, added: asyncio.Event) -> AsyncIterator[dict[str, Any]]:
        sent, since = 0, None
        warned = self._from_form()
        while True:
            added.clear()
            stages = self._gpu_stages or []  # allocate() makes a new list; read it each round
            since = since if since is not None else (stages[0].at if stages else None)
            for stage in stages[sent:]:
                took = stage.at - (since if since is not None else stage.at)
                waiting = stage.progress in (WAITING_PROGRESS, START_TURN_PROGRESS)  # a place: no step's duration
                yield {
                    "progress": stage.progress,
                    "message": stage.message if waiting else f"{stage.message} ({took:.1f} s)",
                }
                since, sent = stage.at, sent + 1
                if stage.progress == 20 and not warned and self._gpu_spec is not None:
                    for warning in self._gpu_spec.warnings:
                        yield {"progress": 20, "message": warning}
                    warned = True
                if stage.progress >= 90:
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(added.wait(), timeout=1.0)


async def answer_or_exit(
    url: str, poll: Callable[[], Awaitable[int | None]], timeout: float, interval: float = 1.0
) -> tuple[int | None, bool]:
    """A server the hub did not start (it restarted): wait until it answers, exits, or ``timeout`` passes.

    Returns (None, False) when it answers, (its exit status, False) when ``poll`` says it
    ended, (None, True) when it stayed alive and silent. JupyterHub itself, after a restart,
    polls once and then only waits for an HTTP answer for ``http_timeout``, without looking
    at the server again: one that dies meanwhile stays "pending" and holds its slice that
    long. Every backend's first poll after a restart runs this (local and Kubernetes).
    """
    deadline = time.monotonic() + timeout
    while True:
        if await _answers_http(url):
            return None, False
        status = await poll()
        if status is not None:
            return status, False
        if time.monotonic() > deadline:
            return None, True
        await asyncio.sleep(interval)


async def _answers_http(url: str) -> bool:
    """Whether a server answers at ``url`` as JupyterHub counts it: any status below 500.

    Not ``jupyterhub.utils.wait_for_http_server``: its attempts have no short timeout (a
    stopped server would hold one for minutes), and the caller watches the process between tries.
    """
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            return response.status < 500
    except (TimeoutError, aiohttp.ClientError):
        return False


def _address(started: Any, server: Any) -> str:
    """``http://IP:PORT`` from what a spawner's start() returned (a URL or an (ip, port) pair)."""
    if isinstance(started, str):
        return started.rstrip("/")
    ip, port = started if isinstance(started, tuple) else (server.ip, server.port)
    return f"http://{ip or '127.0.0.1'}:{port}"


def _died_message(status: int) -> str:
    if status < 0:
        return f"the server was killed by signal {-status} (not stopped through the hub)"
    if status:
        return f"the server exited with status {status} (not stopped through the hub)"
    return "the server process ended without being stopped through the hub (killed, crashed or out of memory)"
