"""The dra backend: ResourceClaimTemplates for whole cards, MPS or time-sliced slices and MIG devices;
the inventory from ResourceSlices and allocated ResourceClaims (fixtures/dra_cluster.yaml cites its sources)."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from spawner import sharing
from spawner.inventory import Allocation
from spawner.shares import GiB, GpuRequest, MiB
from spawner.sharing.base import Isolation, Listing, Target
from spawner.sharing.dra import CLAIMS, SLICES, Dra

FIXTURES = Path(__file__).parent / "fixtures"
FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)
CARD_0 = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"


def cluster() -> dict[str, list[dict[str, Any]]]:
    items = yaml.safe_load((FIXTURES / "dra_cluster.yaml").read_text())["items"]
    kinds: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        kinds.setdefault(item["kind"], []).append(item)
    return kinds


def listing(kinds: dict[str, list[dict[str, Any]]]) -> Listing:
    objects = {SLICES.key: kinds["ResourceSlice"], CLAIMS.key: kinds.get("ResourceClaim", [])}
    return Listing(kinds["Node"], kinds.get("Pod", []), objects)


def test_a_slice_is_a_claim_on_a_shared_gpu_pinned_to_the_chosen_card_with_mps_holding_its_memory() -> None:
    spec = Dra().render(FOUR_GIB, Target(card_bytes=40 * GiB, uuid=CARD_0))
    assert spec.claim == {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": {"memory": "4096Mi"}},
                            "selectors": [
                                {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].uuid == '{CARD_0}'"}}
                            ],
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": "gpu.nvidia.com",
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "GpuConfig",
                                "sharing": {
                                    "strategy": "MPS",
                                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4096Mi"},
                                },
                            },
                        },
                    }
                ],
            }
        }
    }
    assert spec.isolation is Isolation.SOFTWARE and spec.limits == {}
    assert spec.env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.100000"
    assert spec.annotations == {"gpuslice.io/gpu-memory-bytes": str(4 * GiB), "gpuslice.io/sharing-backend": "dra"}


def test_time_slicing_holds_nothing_and_says_so() -> None:
    spec = Dra(slices="timeslicing").render(FOUR_GIB, Target(card_bytes=40 * GiB))
    assert spec.isolation is Isolation.NONE and "without memory isolation" in spec.warnings[0]
    assert spec.claim is not None
    config = spec.claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]
    assert config == {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}


def test_whole_cards_and_mig_profiles() -> None:
    whole = Dra().render(GpuRequest(gpus=2))
    assert whole.claim is not None
    assert whole.claim["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 2,
    }
    migged = Dra(slices="mig").render(FOUR_GIB, Target(product="NVIDIA A100-SXM4-40GB", uuid=CARD_0))
    assert migged.claim is not None
    exactly = migged.claim["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert [s["cel"]["expression"] for s in exactly["selectors"]] == [
        "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'",  # as the driver's demo gpu-test4.yaml selects
        f"device.attributes['gpu.nvidia.com'].parentUUID == '{CARD_0}'",
    ]
    assert migged.isolation is Isolation.HARDWARE
    with pytest.raises(ValueError, match="mps, timeslicing, mig"):
        Dra(slices="vgpu")


def test_the_inventory_reads_the_slices_and_the_allocated_claims() -> None:
    _, inventory = sharing.read(Dra(), listing(cluster()))
    gpus = list(inventory.gpus())
    assert [(g.index, g.uuid[:12], g.model, g.memory_bytes) for g in gpus] == [
        (0, "GPU-4cf8db2d", "NVIDIA A100-SXM4-40GB", 40 * GiB),
        (1, "GPU-9b3e6d1a", "NVIDIA A100-SXM4-40GB", 40 * GiB),
    ]
    assert gpus[0].allocations == [Allocation("ann", "", 4 * GiB, "jupyter-ann")]
    assert gpus[1].allocations == [Allocation("bob", "", 40 * GiB, "jupyter-bob", True)]  # its owner, not reserved yet
    assert gpus[0].free_bytes == 36 * GiB and gpus[1].free_bytes == 0
    assert inventory.warnings == [] and inventory.slice_note is not None and "MPS" in inventory.slice_note


def test_gpus_published_for_one_claim_at_a_time_are_said_to_take_a_whole_card() -> None:
    kinds = cluster()
    for device in kinds["ResourceSlice"][0]["spec"]["devices"]:
        del device["allowMultipleAllocations"]  # as NVIDIA's driver publishes them today
    inventory = sharing.build_kube(kinds["Node"], [], Dra(), objects=listing(kinds).objects)
    assert any("one claim at a time" in w and "gpu-a" in w for w in inventory.warnings)


def test_a_claim_on_a_device_no_slice_publishes_is_a_warning_and_older_pool_generations_are_ignored() -> None:
    kinds = cluster()
    stale = yaml.safe_load(yaml.safe_dump(kinds["ResourceSlice"][0]))
    stale["metadata"]["name"] = "stale"
    stale["spec"]["pool"]["generation"] = 0
    stale["spec"]["devices"][0]["name"] = "gpu-7"
    kinds["ResourceSlice"].append(stale)
    kinds["ResourceClaim"][1]["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-9"
    inventory = sharing.read(Dra(), listing(kinds))[1]
    assert len(list(inventory.gpus())) == 2
    assert any("gpu-a/gpu-9, which no ResourceSlice publishes" in w for w in inventory.warnings)
    assert sum(g.allocated_bytes for g in inventory.gpus()) == 4 * GiB + 0 * MiB
