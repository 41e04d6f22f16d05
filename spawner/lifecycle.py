"""The local backend's lifecycle: the slice held in the SQLite ledger from start to clear_state.

``LedgerGpuMixin`` (the base of ``spawner.local.LocalGpuSpawner``) places the slice and
writes it to the ledger before the server process exists, records each step as a server
event, and releases the slice however the server ends.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import aiohttp
from traitlets import Integer, Unicode

from spawner import environ, metrics
from spawner.backends import Backend, ServerGpuSpec, render
from spawner.form import in_form_words
from spawner.inventory import Inventory, build_local
from spawner.ledger import Held, Ledger, LedgerError, stop_message
from spawner.mixin import GpuShareMixin
from spawner.placement import Demand
from spawner.quotas import Usage
from spawner.request import GpuRefused
from spawner.shares import GpuRequest, RequestKind, format_bytes

HOOK_DIR = Path(__file__).parent / "kernel_hook"


class LedgerGpuMixin(GpuShareMixin):
    """The local backend's lifecycle: the slice is placed here and held in the SQLite ledger.

    On ``start`` it checks the request and the group quotas, places the slice with the
    core's policy and writes it to the ledger, all before the server process exists; it
    releases the slice however the server ends (JupyterHub calls ``clear_state`` for
    each). Each step is recorded as a server event, so the portal can say why a server
    waits or why it failed.
    """

    gpu_ledger_path = Unicode(
        "gpuslice-ledger.sqlite", help="The SQLite file holding every slice handed out on this machine."
    ).tag(config=True)
    gpu_idle_timeout = Integer(
        0, help="The idle culler's timeout in seconds (0: none), to say who stopped an idle server."
    ).tag(config=True)
    # False on a spawner the hub loaded from its database: its first poll checks the server.
    _gpu_checked_since_restart = False
    _gpu_silent_after_restart = False

    _gpu_ledger: Ledger | None = None
    _gpu_stages: list[Stage] | None = None

    @property
    def _ledger(self) -> Ledger:
        """This spawner's Ledger, made once (its constructor creates the schema: a write)."""
        if self._gpu_ledger is None or self._gpu_ledger.path != Path(self.gpu_ledger_path):
            self._gpu_ledger = Ledger(self.gpu_ledger_path)
        return self._gpu_ledger

    def _inventory(self, holds: list[Held]) -> Inventory:
        return build_local(self._machine.gpus, [(h.gpu_index, h.allocation()) for h in holds])

    def form_state(self) -> tuple[Inventory, Usage]:
        others = [h for h in self._ledger.holdings() if h.key != self._key]
        return self._inventory(others), _usage(others, self.user.name)  # type: ignore[attr-defined]

    # -- the decision, inside the ledger's transaction ----------------------------------

    def _decide(self, request: GpuRequest, image: str, holds: list[Held]) -> list[Held]:
        inventory = self._inventory(holds)
        usage = _usage(holds, self.user.name)  # type: ignore[attr-defined]
        group, choice = self.check_and_place(request, image, inventory, usage, [_demand_of(h) for h in holds])
        if choice is None:
            return []
        node = inventory.nodes[choice.node]
        return [
            Held(
                self._key,
                node.gpus[i].index,
                self.user.name,  # type: ignore[attr-defined]
                self.name,  # type: ignore[attr-defined]
                node.gpus[i].memory_bytes
                if request.kind is RequestKind.WHOLE
                else request.bytes_on(node.gpus[i].memory_bytes),
                request.kind is RequestKind.WHOLE,
                group,
            )
            for i in choice.gpus
        ]

    def allocate(self) -> tuple[GpuRequest, list[Held]]:
        """Check and place the request; write it to the ledger. Counts refusals."""
        self._gpu_stages = []
        try:
            request, image = self.gpu_request()
            self._gpu_models = self.gpu_model_folders()
            self._record("requested", 10, f"asked for {request.describe()} with image {image}")
            self._stage(10, f"asked for {request.describe()} with image {image}")
            holds = self._ledger.allocate(self._key, lambda current: self._decide(request, image, current))
        except GpuRefused as refusal:
            metrics.SPAWN_REFUSED.labels(reason=refusal.refusal).inc()
            if self._from_form():
                refusal.jupyterhub_message = in_form_words(refusal.jupyterhub_message)
            self._record("refused", 100, refusal.jupyterhub_message)
            raise
        assert holds is not None  # _decide raises rather than returning None
        return request, holds

    def _spec_for(self, request: GpuRequest, holds: list[Held]) -> ServerGpuSpec:
        if not holds:
            return render(request, Backend.LOCAL)
        by_index = {g.index: g for g in self._machine.gpus}
        cards = [by_index[h.gpu_index] for h in holds]
        devices = tuple(g.uuid if not g.simulated else str(g.index) for g in cards)
        return render(request, Backend.LOCAL, card_bytes=cards[0].memory_bytes, devices=devices)

    # -- the spawner lifecycle ----------------------------------------------------------

    async def start(self) -> Any:
        request, holds = self.allocate()
        self._gpu_holds = holds
        self._gpu_spec = self._spec_for(request, holds)
        placed = self.placement_text() or "no GPU"
        self.log.info("gpuslice: %s gets %s: %s", self._key, request.describe(), placed)  # type: ignore[attr-defined]
        self._record("placed", 20, f"placed: {placed}; starting the server")
        self._stage(20, f"GPU placed: {placed}")
        self._gpu_starting = True
        self._gpu_checked_since_restart = True  # this hub process watches the start itself
        self._gpu_silent_after_restart = False
        try:
            self.prepare_home()
            self._stage(35, "home folder ready")
            self.prepare_server()
            models = ", ".join(self._gpu_models or {})
            self._stage(50, f"models mounted in ~/models: {models}" if models else "no models to mount")
            result = await super().start()  # type: ignore[misc]
        except BaseException as exc:
            self._ledger.release(self._key)
            self._gpu_holds = None
            self._record("failed", 100, f"the server did not start: {exc or type(exc).__name__}")
            raise
        finally:
            self._gpu_starting = False
        pid = getattr(self, "pid", 0)
        if pid and holds:
            self._ledger.set_pid(self._key, pid)
        started = f"server process started{f' (pid {pid})' if pid else ''}; waiting for it to answer"
        self._record("started", 50, started)
        self._stage(70, started)
        return result

    def prepare_home(self) -> None:
        """Called after the slice is held: make the user's home folder (a backend knows where)."""

    def prepare_server(self) -> None:
        """Called after the slice is held, before the server starts (a backend mounts models here)."""

    async def poll(self) -> int | None:
        status: int | None = await super().poll()  # type: ignore[misc]
        if status is None and not self._gpu_checked_since_restart:
            # The hub's first look at a server it did not start (it restarted meanwhile).
            self._gpu_checked_since_restart = True
            status = await self._answer_or_exit()
        if status is None and self._gpu_holds:
            # Running: make sure the ledger still holds the slice (it may have been lost). A read
            # on every poll; the write lock only when something must be put back.
            missing = self._ledger.missing(self._gpu_holds)
            if missing:
                self._ledger.restore(missing)
        if status is not None and not self._gpu_silent_after_restart and self._last_event_kind() == "started":
            # Nobody stopped it (stop() records "stopped"): it crashed, exited or was killed.
            self._record("died", 100, _died_message(status))
        return status

    async def stop(self, now: bool = False) -> None:
        self._record(*self._stop_reason())
        await super().stop(now=now)  # type: ignore[misc]

    async def _answer_or_exit(self) -> int | None:
        """After a hub restart: wait until the server answers HTTP, exits, or ``http_timeout`` passes.

        JupyterHub itself only waits for an answer (up to ``http_timeout``), without
        looking at the process. A server that was starting while the hub was down gives
        up on reaching the hub after about 45 s and exits; without this check it stays
        "pending" and holds its slice for the whole ``http_timeout``.
        """
        timeout = self.http_timeout  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        url = f"{self.server.url}api"  # type: ignore[attr-defined]
        while True:
            if await _answers_http(url):
                return None
            status: int | None = await super().poll()  # type: ignore[misc]
            if status is not None:
                return status
            if time.monotonic() > deadline:
                # Alive but silent: JupyterHub stops it on a non-None status (stop() says why).
                message = "gpuslice: %s did not answer at %s within %s s after the hub restarted"
                self.log.warning(message, self._key, url, timeout)  # type: ignore[attr-defined]
                self._gpu_silent_after_restart = True
                return -1
            await asyncio.sleep(1.0)

    def _stop_reason(self) -> tuple[str, int, str]:
        # JupyterHub stops a server it gave up on from inside start or the wait for it to answer.
        if self._gpu_silent_after_restart:
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s after the hub restarted"
        if self._gpu_starting:
            timeout = self.start_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not start within {timeout} s"
        if getattr(self, "_waiting_for_response", False):
            timeout = self.http_timeout  # type: ignore[attr-defined]
            return "failed", 100, f"gave up: the server did not answer within {timeout} s"
        history = self._ledger.history(self._key)
        activity = getattr(getattr(self, "orm_spawner", None), "last_activity", None)  # naive UTC in the hub's db
        last_activity = activity.replace(tzinfo=UTC).timestamp() if activity is not None else None
        message = stop_message(history[-1] if history else None, time.time(), last_activity, self.gpu_idle_timeout)
        return "stopped", 100, message

    def _record(self, kind: str, progress: int, message: str) -> None:
        try:
            self._ledger.record(self._key, kind, progress, message)
        except LedgerError as exc:
            # History is for people reading the portal; never fail a spawn or stop over it.
            self.log.warning("gpuslice: could not record %s event for %s: %s", kind, self._key, exc)  # type: ignore[attr-defined]

    def _stage(self, progress: int, message: str) -> None:
        if self._gpu_stages is not None:
            self._gpu_stages.append(Stage(progress, message, time.monotonic()))

    def _last_event_kind(self) -> str | None:
        history = self._ledger.history(self._key)
        return history[-1].kind if history else None

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()  # type: ignore[misc]
        if self._gpu_spec is not None:
            env.update(self._gpu_spec.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK_DIR), env.get("PYTHONPATH", "")]))
        if self._machine.simulated and self._gpu_holds:
            env[environ.SIMULATED.name] = "1"
        if self._gpu_models:
            env[environ.MODELS.name] = ",".join(self._gpu_models)
        return env

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()  # type: ignore[misc]
        if self._gpu_holds:
            state["gpuslice_holds"] = [h.__dict__ for h in self._gpu_holds]
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        self._gpu_holds = [Held(**h) for h in state.get("gpuslice_holds", [])] or None

    def clear_state(self) -> None:
        # Every way a server ends passes here: stopped, died (JupyterHub skips stop()
        # for a dead server), culled, failed to start, or found dead after a restart.
        super().clear_state()  # type: ignore[misc]
        self._ledger.release(self._key)
        self._gpu_holds = None

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
        """Each stage of the start as it happens, with how long it took, then the first answer.

        JupyterHub stops reading when the spawn ends and sends its own "ready" event (100%).
        The isolation warning comes once: here, unless the form already showed it.
        """
        sent, since = 0, None
        warned = self._from_form()
        while True:
            stages = self._gpu_stages or []  # start() makes a new list; read it each round
            since = since if since is not None else (stages[0].at if stages else None)
            for stage in stages[sent:]:
                took = stage.at - (since if since is not None else stage.at)
                yield {"progress": stage.progress, "message": f"{stage.message} ({took:.1f} s)"}
                since, sent = stage.at, sent + 1
                if stage.progress == 20 and not warned and self._gpu_spec is not None:
                    for warning in self._gpu_spec.warnings:
                        yield {"progress": 20, "message": warning}
                    warned = True
            started = stages and stages[-1].progress >= 70 and self.server is not None  # type: ignore[attr-defined]
            if started and await _answers_http(f"{self.server.url}api"):  # type: ignore[attr-defined]
                took = time.monotonic() - (since or time.monotonic())
                yield {"progress": 90, "message": f"server answering ({took:.1f} s)"}
                return
            await asyncio.sleep(0.25)


@dataclass(frozen=True)
class Stage:
    """One step of a start, for the progress bar: percent, what happened, when (monotonic)."""

    progress: int
    message: str
    at: float


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


def _died_message(status: int) -> str:
    if status < 0:
        return f"the server was killed by signal {-status} (not stopped through the hub)"
    if status:
        return f"the server exited with status {status} (not stopped through the hub)"
    return "the server process ended without being stopped through the hub (killed, crashed or out of memory)"


def _usage(holds: list[Held], user: str) -> Usage:
    """What ``holds`` (everyone's but the server being started) count against the rules."""
    return Usage(user_servers=len({h.key for h in holds if h.user == user}), group_bytes=_group_bytes(holds))


def _group_bytes(holds: list[Held]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for h in holds:
        if h.group:
            totals[h.group] = totals.get(h.group, 0) + h.memory_bytes
    return totals


def _demand_of(hold: Held) -> Demand:
    return Demand(gpus=1) if hold.whole else Demand(slice_units=float(hold.memory_bytes))
