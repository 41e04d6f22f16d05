"""`python -m hub.reclaimer`: give idle GPU slices to the waiting line (a hub-managed service).

While anyone waits in the GPU line, a server holding a slice whose activity has stopped
for ``--gpu-idle-timeout`` seconds is stopped, longest idle first and no more than the
line needs (spawner/waitline.py ``reclaim`` decides). Its owner is warned first: a
``warned`` event on the server (shown on the portal's Servers page and in the hub's log),
and the server is stopped only if it is still idle ``--warn-before`` seconds later and one
activity report after that: each notebook server reports its activity to the hub every
``activity_report_interval(warn_before)`` seconds (its ``JUPYTERHUB_ACTIVITY_INTERVAL``, set by
the spawner), so a use made before the announced stop is in the hub's ``last_activity`` first.
With nobody waiting nothing is reclaimed (the idle culler's normal timeout applies);
servers without a GPU are never reclaimed.

Presence (docs/platform.md#presence): each notebook server reports whether its owner is there
(hub/presence.py keeps the reports in the ledger, ``Ledger.presence``). Input in a page is a use,
like running a cell; and a server whose owner has left (nothing used, and no JupyterLab page
open for ``--gpu-left-timeout`` seconds, or a page open without input for ``--gpu-no-input-timeout``)
goes to the line sooner, after the same kind of warning; ``--gpu-release-timeout`` seconds after
its owner left it is stopped also when nobody waits. A server that does not report (or reports a
client that cannot tell, such as another editor) is judged by its idleness alone. The decisions are
spawner/waitline.py ``reclaims`` and ``follow_warnings``, which the class-day model calls too.

Activity is JupyterHub's ``last_activity`` for the server (kernels, terminals, the
browser through the proxy), joined with the GPU's own readings where NVML finds real GPUs:
the per-process GPU memory the exporter reads too (``nvml_samples``, each process's server
from its environment: ``owner_from_proc``), summed per server, and each process's SM
utilization since the last look (NVML's per-process samples, ``process_utilization``). A
server whose GPU memory moved since the last look, whose processes ran kernels since then,
or whose processes alone keep a card busy, is not idle (spawner/waitline.py
``busy_processes``, ``with_gpu_activity``). Simulated GPUs give no such evidence.

Which servers hold a GPU: the ledger's rows on one machine; on Kubernetes (``--kube-namespace``)
the notebook pods whose annotations name a sharing backend (the ledger file then holds the
line only). There, activity is JupyterHub's alone: the cards are on other nodes.

Activity is what each server reports, and its owner can forge it (the hub keeps no timestamp
later than now, hub/activity.py, so forging takes a process that keeps reporting). What
bounds that is ``--max-hold GROUP=SECONDS`` (a class's ``max_hold``): while others wait, a
server that has held its slice that long is warned and stopped however used it looks
(spawner/waitline.py ``over_hold``), counted from the placement as the platform recorded it
(the ledger's row, or the pod's creation) for the class charged for the slice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import requests

from hub.exporter import OwnerOf, Source, owner_from_proc
from spawner import environ
from spawner.gpus import GpuSample
from spawner.inventory import GROUP_ANNOTATION, SERVERNAME, USERNAME, holds_resources
from spawner.ledger import Ledger, server_key
from spawner.line_timeouts import GPU_IDLE_TIMEOUT_S, GPU_LEFT_TIMEOUT_S, GPU_NO_INPUT_TIMEOUT_S, GPU_RELEASE_TIMEOUT_S
from spawner.quotas import GroupRules
from spawner.sharing.base import ANNOTATION_BACKEND
from spawner.waitline import (
    HELD,
    HELD_TOO_LONG,
    IDLE,
    LEFT,
    RELEASED,
    WARNED,
    GpuTrace,
    Holder,
    Presence,
    PresenceRule,
    ReclaimWarning,
    activity_report_interval,
    busy_alone,
    busy_processes,
    follow_gpu_memory,
    follow_warnings,
    idle_since,
    presence_stale_after,
    reclaims,
    still_freeing,
    waits_for_room,
    warning_save_window,
    with_gpu_activity,
    without_warning_saves,
)
from spawner.words import instant

log = logging.getLogger("gpuslice.reclaimer")


def holders_from_hub(users: Iterable[dict[str, Any]], gpu_keys: set[str]) -> list[Holder]:
    """Ready servers from JupyterHub's ``GET /users?state=ready`` as reclaiming sees them."""
    found = []
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            if not server.get("ready"):
                continue
            key = server_key(user["name"], name)
            last = _timestamp(server.get("last_activity"))
            found.append(Holder(key, key in gpu_keys, last, last))
    return found


class Hold(NamedTuple):
    """A server's hold on a GPU as the platform recorded it."""

    since: float | None  # when the slice was placed
    group: str | None  # the class charged for it


def gpu_holds_from_pods(pods: Iterable[dict[str, Any]]) -> dict[str, Hold]:
    """The servers whose notebook pods hold a GPU (KubeGpuSpawner names the sharing backend on those only),
    each from its pod's creation (made once the line placed it), for the group its annotation names."""
    holds = {}
    for pod in pods:
        meta = pod.get("metadata", {})
        annotations = meta.get("annotations") or {}
        if ANNOTATION_BACKEND not in annotations or not holds_resources(pod):
            continue
        user = annotations.get(USERNAME) or (meta.get("labels") or {}).get(USERNAME)
        if user:
            key = server_key(user, annotations.get(SERVERNAME, ""))
            holds[key] = Hold(_timestamp(meta.get("creationTimestamp")), annotations.get(GROUP_ANNOTATION))
    return holds


def with_holds(holders: Iterable[Holder], holds: Mapping[str, Hold], max_holds: Mapping[str, float]) -> list[Holder]:
    """The holders with when their slice was placed and their class's ``max_hold`` (none: no cap)."""
    joined = []
    for h in holders:
        hold = holds.get(h.key)
        if hold is not None:
            h = replace(h, held_since=hold.since, max_hold_s=max_holds.get(hold.group or ""))
        joined.append(h)
    return joined


def max_hold_options(groups: Iterable[GroupRules]) -> list[str]:
    """``--max-hold GROUP=SECONDS`` for each group with a ``max_hold`` (the default rules' too: users in no group)."""
    quotas = [g.quota for g in groups]
    return [f"--max-hold={q.name}={q.max_hold_s:g}" for q in quotas if q.max_hold_s]


def _max_hold(text: str) -> tuple[str, float]:
    group, _, seconds = text.rpartition("=")
    try:
        return group, float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"write GROUP=SECONDS, e.g. ml101=7200, not {text!r}") from None


async def _list_notebook_pods(namespace: str) -> list[dict[str, Any]]:
    """The namespace's notebook pods, with the hub pod's ServiceAccount (or KUBECONFIG outside a cluster)."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config import ConfigException

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException:
        await config.load_kube_config()
    async with client.ApiClient() as api:
        response: Any = await client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector="component=singleuser-server", _preload_content=False
        )  # unread: the pods as the API's JSON, as the inventory reads them
        return list(json.loads(await response.read()).get("items") or [])


def unanswered(on_kubernetes: bool) -> tuple[type[Exception], ...]:
    """What a look meets when the hub or the cluster does not answer. The Kubernetes client's errors are
    imported only where it is used: importing it costs ~0.8 s of CPU at each start of a single-machine hub."""
    if not on_kubernetes:
        return (requests.RequestException, OSError)
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config import ConfigException

    return (requests.RequestException, OSError, ApiException, ConfigException)


def kube_gpu_holds(namespace: str) -> Callable[[], dict[str, Hold]]:
    return lambda: gpu_holds_from_pods(asyncio.run(_list_notebook_pods(namespace)))


def gpu_evidence(
    samples: Iterable[GpuSample], owner_of: OwnerOf, gpu_keys: set[str]
) -> tuple[dict[str, int], list[tuple[float, list[str]]]]:
    """Per GPU server, its processes' GPU memory now (0 for none); per card, its utilization and the
    owners of its processes (a process of no notebook server counts as an owner of its own)."""
    memory = dict.fromkeys(gpu_keys, 0)
    cards = []
    for sample in samples:
        owners = []
        for pid, used in sample.processes:
            owner = owner_of(pid)
            key = server_key(owner.user, owner.server) if owner else f"pid {pid}"
            owners.append(key)
            if key in memory:
                memory[key] += used
        cards.append((sample.utilization_pct, owners))
    return memory, cards


def process_utilization(samples: Iterable[GpuSample], owner_of: OwnerOf, gpu_keys: set[str]) -> dict[str, float]:
    """Per GPU server, the highest SM utilization (%) of any of its processes since the last look
    (NVML's per-process samples; 0 for none). Processes of no notebook server are left out."""
    busiest = dict.fromkeys(gpu_keys, 0.0)
    for sample in samples:
        for pid, pct in sample.process_sm_pct:
            owner = owner_of(pid)
            key = server_key(owner.user, owner.server) if owner else None
            if key in busiest:
                busiest[key] = max(busiest[key], float(pct))
    return busiest


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None  # never active: treated as busy rather than stopped on a guess
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


class Reclaimer:
    """One look at the line and the servers per ``step``; remembers whom it has warned."""

    def __init__(
        self,
        api_url: str,
        token: str,
        ledger: Ledger,
        gpu_idle_timeout: float,
        warn_before: float,
        gpu_source: Source | None = None,
        owner_of: OwnerOf = owner_from_proc,
        gpu_holds: Callable[[], Mapping[str, Hold]] | None = None,
        max_holds: Mapping[str, float] | None = None,
        rule: PresenceRule | None = None,
    ) -> None:
        """``gpu_holds``: the servers holding a GPU now (default: the ledger's holds); ``max_holds``: each
        class's ``max_hold`` in seconds; ``rule``: reclaiming and releasing by the servers' presence
        reports (None: by idleness alone)."""
        self.api_url, self.ledger = api_url.rstrip("/"), ledger
        self.gpu_holds = gpu_holds or (lambda: {k: Hold(*v) for k, v in ledger.hold_starts().items()})
        self.max_holds = dict(max_holds or {})
        self.timeout, self.warn_before = gpu_idle_timeout, warn_before
        self.gpu_source, self.owner_of = gpu_source, owner_of
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.rule = rule
        self.warned: dict[str, ReclaimWarning] = {}  # whom it warned, when, why, and the stop it announced
        self.seen_at_warning: dict[str, float] = {}  # each warned server's last use when warned
        self.freeing: dict[str, float] = {}  # servers stopped for the line whose slices may not have reached it
        self.traces: dict[str, GpuTrace] = {}

    def holders(self, users: list[dict[str, Any]], gpu_keys: set[str], now: float) -> list[Holder]:
        """The hub's ready servers, with the GPU's own readings joined when there are real GPUs."""
        holders = holders_from_hub(users, gpu_keys)
        if self.gpu_source is None:
            return holders
        samples = self.gpu_source()
        memory, cards = gpu_evidence(samples, self.owner_of, gpu_keys)
        self.traces = follow_gpu_memory(self.traces, memory, now)
        busy = busy_alone(cards) | busy_processes(process_utilization(samples, self.owner_of, gpu_keys))
        return with_gpu_activity(holders, self.traces, busy)

    def step(self, now: float) -> list[str]:
        """Warn and stop as needed; returns the servers stopped."""
        waiting = sum(1 for e in self.ledger.line() if waits_for_room(e, now))
        presence = self.ledger.presence() if self.rule is not None else {}
        if not waiting and not presence:
            self.warned, self.freeing = {}, {}
            return []  # nobody waits and no server reports its owner: nothing to reclaim or release
        response = self.session.get(f"{self.api_url}/users", params={"state": "active"}, timeout=30)
        response.raise_for_status()
        users = response.json()
        active = {server_key(u["name"], name) for u in users for name in (u.get("servers") or {})}
        self.freeing = still_freeing(self.freeing, active, now, grace_s=self.warn_before) if waiting else {}
        needed = waiting - len(self.freeing)  # the slices already on their way to the line are not needed again
        holds = self.gpu_holds()
        holders = with_presence(with_holds(self.holders(users, set(holds), now), holds, self.max_holds), presence)
        holders = without_warning_saves(
            holders, self.warned, self.seen_at_warning, warning_save_window(self.warn_before)
        )
        decided = reclaims(
            holders,
            waiting=max(0, needed),
            now=now,
            gpu_idle_timeout=self.timeout,
            warn_before=self.warn_before,
            presence=self.rule,
        )
        # The line's need on its way (needed <= 0): the warnings given for it stand as they are.
        keep = {k for k, w in self.warned.items() if w.reason != RELEASED and k in active} if needed <= 0 else set()
        before = self.warned
        self.warned, due = follow_warnings(before, decided, now, activity_report_interval(self.warn_before), keep)
        idle = {h.key: idle_since(h) for h in holders}
        self.seen_at_warning = {
            k: v for k, v in self.seen_at_warning.items() if k in self.warned and before.get(k) == self.warned[k]
        }
        for key, warning in sorted(self.warned.items()):
            if before.get(key) != warning:
                if (since := idle.get(key)) is not None:
                    self.seen_at_warning[key] = since  # its activity then: the warning's own save does not renew it
                self.ledger.record(key, "warned", 100, self._warning(warning))
                log.info("gpuslice reclaimer: warned %s (%s)", key, warning.reason)
        for key in due:
            if self._stop(key, self.warned.pop(key).reason) and waiting:  # its slice is on its way to the line
                self.freeing[key] = now
        return due

    def next_look(self, now: float, interval: float) -> float:
        """Seconds until the next look: ``interval``, or sooner when a warned server's announced stop comes first
        (the stop happens at the time the warning said, not up to an interval later)."""
        stops = [w.stops_at - now for w in self.warned.values()]
        return max(0.1, min([interval, *stops]))

    def _warning(self, warning: ReclaimWarning) -> str:
        """The warning's words (its reason's, spawner/waitline.py ``WARNED``), with the stop's time as an
        instant the pages show in the reader's clock."""
        if warning.reason == HELD:
            return f"{HELD_TOO_LONG} while others wait for a GPU: stops at {instant(warning.stops_at)}"
        return f"{WARNED[warning.reason]}: stops at {instant(warning.stops_at)} unless used"

    def _stop(self, key: str, reason: str) -> bool:
        # Before the stop: the spawner names who stopped it from this note, as for the portal's.
        why = {
            IDLE: f"idle for over {_minutes(self.timeout)} while others waited",
            LEFT: "nobody there while others waited",
            HELD: f"{HELD_TOO_LONG} of its class while others waited",
            RELEASED: f"nobody there for over {_minutes(self.rule.release_timeout if self.rule else 0)}: released",
        }[reason]
        self.ledger.record(key, "stopping", 90, f"the GPU line's reclaimer: {why}")
        user, name = key.split("/", 1)
        path = f"/users/{quote(user)}/servers/{quote(name)}" if name else f"/users/{quote(user)}/server"
        response = self.session.delete(f"{self.api_url}{path}", timeout=60)
        if response.status_code not in (202, 204):
            log.warning("gpuslice reclaimer: stopping %s answered HTTP %s", key, response.status_code)
            return False
        log.info("gpuslice reclaimer: stopped %s (%s)", key, why)
        return True


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def with_presence(holders: Iterable[Holder], presence: Mapping[str, Presence]) -> list[Holder]:
    """The holders with what their servers last reported of their owners; a report made before the
    slice was placed is an earlier server's and says nothing of this one."""
    joined = []
    for h in holders:
        seen = presence.get(h.key)
        if seen is not None and (h.held_since is None or seen.reported >= h.held_since):
            h = replace(h, presence=seen)
        joined.append(h)
    return joined


def nvml_source() -> Source | None:
    """The real GPUs' readings through NVML; None when NVML finds none (simulated GPUs say nothing)."""
    from spawner.gpus import detect, nvml_samples

    if detect("1x1GiB")[1] != "NVML":
        return None
    import pynvml

    log.info("gpuslice reclaimer: joining NVML's per-process GPU memory and utilization to JupyterHub's activity")
    last_look_us = time.time_ns() // 1000

    def read() -> list[GpuSample]:
        nonlocal last_look_us
        since, last_look_us = last_look_us, time.time_ns() // 1000  # NVML's samples are stamped in CPU µs
        return nvml_samples(pynvml, process_utilization_since_us=since)

    return read


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, required=True, help="the ledger's SQLite file")
    parser.add_argument(
        "--gpu-idle-timeout", type=float, default=GPU_IDLE_TIMEOUT_S, help="seconds idle before reclaiming"
    )
    parser.add_argument(
        "--gpu-left-timeout",
        type=float,
        default=GPU_LEFT_TIMEOUT_S,
        help="seconds after the owner left before reclaiming",
    )
    parser.add_argument(
        "--gpu-no-input-timeout",
        type=float,
        default=GPU_NO_INPUT_TIMEOUT_S,
        help="seconds without input in a page left open before reclaiming",
    )
    parser.add_argument(
        "--gpu-release-timeout",
        type=float,
        default=GPU_RELEASE_TIMEOUT_S,
        help="seconds after the owner left before releasing, whoever waits",
    )
    parser.add_argument("--warn-before", type=float, default=180.0, help="seconds between the warning and the stop")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between looks")
    parser.add_argument("--kube-namespace", default="", help="on Kubernetes: the notebook pods' namespace")
    parser.add_argument(
        "--max-hold",
        type=_max_hold,
        action="append",
        default=[],
        help="GROUP=SECONDS: while others wait, the longest a server charged to GROUP holds its slice (repeatable)",
    )
    args = parser.parse_args(argv)
    env = environ.read()
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    reclaimer = Reclaimer(
        env.require(environ.HUB_API_URL),
        env.require(environ.HUB_API_TOKEN),
        Ledger(args.ledger),
        args.gpu_idle_timeout,
        args.warn_before,
        None if args.kube_namespace else nvml_source(),
        gpu_holds=kube_gpu_holds(args.kube_namespace) if args.kube_namespace else None,
        max_holds=dict(args.max_hold),
        rule=PresenceRule(
            args.gpu_left_timeout,
            args.gpu_no_input_timeout,
            args.gpu_release_timeout,
            presence_stale_after(activity_report_interval(args.warn_before)),
        ),
    )
    errors = unanswered(on_kubernetes=bool(args.kube_namespace))
    try:
        while True:
            try:
                reclaimer.step(time.time())
            except errors as exc:
                log.warning("gpuslice reclaimer: the hub or the cluster did not answer (%s); trying again", exc)
            time.sleep(reclaimer.next_look(time.time(), args.interval))
    except KeyboardInterrupt:  # the hub stops its services with SIGINT: end quietly, not with a traceback
        return


if __name__ == "__main__":
    main()
