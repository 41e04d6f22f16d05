"""The hub's spawns and the job dispatcher are two processes placing on one cluster: each sees the room the
other just took, before its pod is listed (the ledger's ``placing``, spawner/kube.py and
hub/job_dispatch_kube.py).

Seen in CI: a backfill job yielded its card to a student's server, and in the moment between the server's
placement and its pod's listing the dispatcher placed the job on the same card again. Here the listing is
held still (no pod is ever listed), which is that moment made as long as the test needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hub.job_dispatch_kube import KubeJobs, job_pod_from_args
from spawner.inventory import Inventory
from spawner.job_ledger import JobLedger, JobRecord, Placement
from spawner.jobs import QUEUED, STARTING
from spawner.kube import CACHES, ClusterCache, KubeGpuSpawner, Snapshot
from spawner.placement import Choice
from spawner.quotas import GroupRules
from spawner.request import GpuRefused
from spawner.sharing.base import Listing, SharingBackend
from tests.hub.test_job_dispatch import new_job
from tests.kube.test_kube_spawner import LOOP, StubUser, make
from tests.kube.test_sharing_fake import acme_node, acme_pod
from tests.spawner.sharing import fake

RULES = [GroupRules(name="default", max_slice="16GiB")]


@dataclass
class StillListing(KubeJobs):
    """The dispatcher's look over a listing that does not change; the Jobs it would make are noted, not sent."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    made: list[int] = field(default_factory=list)

    async def _listing(self) -> tuple[Listing, list[dict[str, Any]]]:
        return Listing(self.nodes, self.pods, {}, now=datetime.now(UTC)), []

    async def _create(
        self, job: JobRecord, fitted: SharingBackend, inventory: Inventory, choice: Choice | None, placed: Placement
    ) -> None:
        self.made.append(job.id)

    async def _follow(self, active: dict[int, JobRecord], jobs: Any, pods: Sequence[Mapping[str, Any]]) -> None:
        return None


def spawner(user: str, gpu_memory: str, ledger: Path) -> KubeGpuSpawner:
    made = make("acme", StubUser(user), gpu_memory=gpu_memory)
    made.gpu_groups = RULES
    made.gpu_ledger_path = str(ledger)
    made.gpu_inventory_ttl = 3600.0
    return made


NODES, PODS = [acme_node("acme-1")], [acme_pod("busy", 0, 12288)]


def listed_still() -> None:
    """The hub's listing, as the API would give it, whenever a spawn reads it (a placement forgets it)."""
    CACHES.setdefault("default", ClusterCache())._snapshot = Snapshot(NODES, PODS, float("inf"))


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    """Two 16 GiB cards; card 0 has 12 GiB taken by a listed pod: 4 GiB and 16 GiB free, as listed."""
    nodes, pods = NODES, PODS
    ledger = JobLedger(tmp_path / "ledger.sqlite")
    dispatcher = StillListing(
        ledger, None, fake.Acme(), job_pod_from_args("default", "", "", "", 60), lambda: RULES, nodes=nodes, pods=pods
    )
    yield ledger, dispatcher
    CACHES.clear()


def test_a_server_placed_and_not_listed_keeps_its_card_from_a_job_and_a_placed_job_from_a_server(
    cluster: Any, tmp_path: Path
) -> None:
    ledger, dispatcher = cluster
    ann = spawner("ann", "16GiB", ledger.path)
    listed_still()
    LOOP.run_until_complete(ann._check_and_place())  # card 1, whole: its pod is never listed here
    assert [p.key for p in ledger.placing()] == ["ann/"]

    job = new_job(ledger, tmp_path / "home", {"command": ["a"], "gpu_memory": "16GiB"}, user="cy")
    LOOP.run_until_complete(dispatcher.step(0.0))
    assert dispatcher.made == [] and ledger.job(job.id).state == QUEUED  # ann's card is not free for it

    ann._forget_placement()  # what her server's stop (or a failed start) does first: no API here to stop a pod
    assert ledger.placing() == []
    LOOP.run_until_complete(dispatcher.step(0.0))
    assert dispatcher.made == [job.id] and ledger.job(job.id).state == STARTING
    assert [p.key for p in ledger.placing()] == [f"cy/job:{job.id}"]

    # The job's pod is not listed yet either: a server of 8 GiB finds 4 GiB free, not card 1's 16.
    bob = spawner("bob", "8GiB", ledger.path)
    listed_still()
    with pytest.raises(GpuRefused) as refused:
        LOOP.run_until_complete(bob._check_and_place())
    assert "The largest free slice is 4 GiB" in refused.value.jupyterhub_message
    assert [p.key for p in ledger.placing()] == [f"cy/job:{job.id}"]  # a refused spawn leaves nothing
