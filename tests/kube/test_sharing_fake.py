"""A backend added as a single file (tests/spawner/sharing/fake.py) is offered, read and spawned with.

KubeGpuSpawner lists the cluster, places the request on the fake backend's cards, builds the
pod with its resources, says its words in the form and refuses with the core's explanation
when its cards are full: nothing in spawner/ names the backend.
"""

from pathlib import Path
from typing import Any

import pytest

from spawner import sharing
from spawner.kube import CACHES, ClusterCache, KubeGpuSpawner, Snapshot
from spawner.quotas import GroupRules
from spawner.request import GpuRefused
from tests.kube.test_kube_spawner import LOOP, make, pod_of
from tests.spawner.sharing import fake

GiB = 2**30


def acme_node(name: str) -> dict[str, Any]:
    allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110", fake.CARDS: "2"}
    labels = {fake.CARD_MIB: "16384", "nvidia.com/gpu.product": "Acme-16"}
    status = {"allocatable": allocatable, "capacity": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}, "status": status}


def acme_pod(name: str, card: int, mib: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"hub.jupyter.org/username": name, fake.CARD: str(card)},
        },
        "spec": {"nodeName": "acme-1", "containers": [{"name": "c", "resources": {"limits": {fake.VRAM: str(mib)}}}]},
        "status": {"phase": "Running"},
    }


def spawner_on(pods: list[dict[str, Any]], ledger: Path) -> KubeGpuSpawner:
    spawner = make("acme", gpu_memory="8GiB")
    # A user in no class has the finite default rules (4 GiB at most): this one may ask for 8.
    spawner.gpu_groups = [GroupRules(name="default", max_slice="16GiB")]
    spawner.gpu_ledger_path = str(ledger)
    spawner.gpu_inventory_ttl = 3600.0
    cache = CACHES.setdefault(spawner.namespace, ClusterCache())
    cache._snapshot = Snapshot([acme_node("acme-1")], pods, float("inf"))  # the listing, as the API would give it
    return spawner


@pytest.fixture(autouse=True)
def _forget_the_listing() -> Any:
    yield
    CACHES.clear()


def test_the_fake_backend_is_in_the_one_table() -> None:
    assert "acme" in sharing.names(kubernetes=True)
    assert make("acme").sharing_backend() == fake.Acme()


def test_a_spawn_places_on_the_fake_cards_and_builds_its_pod(tmp_path: Path) -> None:
    spawner = spawner_on([acme_pod("busy", 0, 12288)], tmp_path / "ledger.sqlite")
    form = LOOP.run_until_complete(spawner._default_options_form()(spawner))
    assert "held to its memory by Acme&#39;s driver" in form
    LOOP.run_until_complete(spawner._check_and_place())
    _, choice = spawner._gpu_placement or (None, None)
    assert choice is not None and choice.gpus == (1,)  # card 0 has 4 GiB free: the 8 GiB go to card 1
    pod = pod_of(spawner)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"][fake.VRAM] == "8192"
    assert pod["metadata"]["annotations"]["gpuslice.io/sharing-backend"] == "acme"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSLICE_ISOLATION"] == "software" and env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.500000"


def test_a_spawn_the_fake_cards_cannot_hold_is_refused_with_the_explanation(tmp_path: Path) -> None:
    spawner = spawner_on([acme_pod("a", 0, 12288), acme_pod("b", 1, 12288)], tmp_path / "ledger.sqlite")
    with pytest.raises(GpuRefused) as refused:
        LOOP.run_until_complete(spawner._check_and_place())
    assert "The largest free slice is 4 GiB" in refused.value.jupyterhub_message
    assert spawner._gpu_pod is None  # nothing was built
