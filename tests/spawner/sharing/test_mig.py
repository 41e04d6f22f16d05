import pytest

from spawner.shares import GiB, GpuRequest, MiB, ShareError
from spawner.sharing import build_kube
from spawner.sharing.base import Isolation, Target
from spawner.sharing.mig import Mig, MigProductError, MigProfile
from spawner.sharing.mig import card as mig_card
from spawner.sharing.mig import smallest_profile as smallest_mig_profile
from spawner.sharing.mig import table as mig_table
from tests.spawner.sharing.objects import node, pod

QUARTER = GpuRequest(fraction=0.25)
A100_40 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(
    ("asked", "profile"),
    [(1 * GiB, "1g.5gb"), (4 * GiB, "1g.5gb"), (5 * GiB, "2g.10gb"), (12 * GiB, "3g.20gb"), (30 * GiB, "7g.40gb")],
)
def test_mig_takes_the_smallest_profile_that_holds_the_request(asked: int, profile: str) -> None:
    spec = Mig().render(GpuRequest(memory_bytes=asked), Target(product=A100_40))
    assert spec.limits == {f"nvidia.com/mig-{profile}": "1"}
    assert spec.isolation is Isolation.HARDWARE


def test_mig_prefers_fewer_compute_slices_among_equal_memory() -> None:
    profiles = (MigProfile("4g.20gb", 19968, 4), MigProfile("3g.20gb", 19968, 3))
    assert smallest_mig_profile(15 * GiB, profiles).name == "3g.20gb"


def test_mig_refuses_more_than_the_largest_instance() -> None:
    with pytest.raises(ShareError, match=r"largest MIG instance here \(7g.40gb"):
        Mig().render(GpuRequest(memory_bytes=60 * GiB), Target(product=A100_40))


def test_mig_share_resolves_against_the_card() -> None:
    # A fifth of 80 GiB (16 GiB) fits 1g.20gb (fewer compute slices than 2g.20gb) ...
    spec = Mig().render(GpuRequest(fraction=0.2), Target(card_bytes=80 * GiB, product=H100))
    assert spec.limits == {"nvidia.com/mig-1g.20gb": "1"}
    # ... but a quarter (20 GiB) does not: 1g.20gb really offers 19.5 GiB.
    spec = Mig().render(QUARTER, Target(card_bytes=80 * GiB, product=H100))
    assert spec.limits == {"nvidia.com/mig-3g.40gb": "1"}


@pytest.mark.parametrize(
    ("label", "card"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-80GB"),  # GFD's single MIG strategy
        ("NVIDIA-A30", "A30-24GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-PCIe", "H100-80GB"),
        ("NVIDIA-H100-NVL", "H100-94GB"),
        ("NVIDIA-H100-SXM5-94GB", "H100-94GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-H200-NVL", "H200-141GB"),
    ],
)
def test_mig_tables_are_chosen_by_the_gpu_product_label(label: str, card: str) -> None:
    assert mig_card(label) == card


def test_an_a100_80gb_label_sizes_1g_10gb_from_its_table() -> None:
    table = mig_table("NVIDIA-A100-SXM4-80GB")
    assert {p.name: p.memory_mib for p in table}["1g.10gb"] == 9728  # not 10 GB read from the name (9,537 MiB)
    spec = Mig().render(GpuRequest(memory_bytes=9 * GiB), Target(product="NVIDIA-A100-SXM4-80GB"))
    assert spec.limits == {"nvidia.com/mig-1g.10gb": "1"}


def test_the_same_request_takes_each_cards_own_smallest_profile() -> None:
    request = GpuRequest(memory_bytes=4 * GiB)
    chosen = {
        label: next(iter(Mig().render(request, Target(product=label)).limits))
        for label in ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A30", "NVIDIA-H100-NVL", "NVIDIA-H200")
    }
    assert chosen == {
        "NVIDIA-A100-SXM4-40GB": "nvidia.com/mig-1g.5gb",
        "NVIDIA-A30": "nvidia.com/mig-1g.6gb",
        "NVIDIA-H100-NVL": "nvidia.com/mig-1g.12gb",
        "NVIDIA-H200": "nvidia.com/mig-1g.18gb",
    }


@pytest.mark.parametrize("label", ["Tesla-T4", "NVIDIA-L40S", "NVIDIA-A100", "unknown", ""])
def test_an_unknown_product_is_an_error_naming_the_label(label: str) -> None:
    with pytest.raises(MigProductError, match=rf"nvidia.com/gpu.product='{label}'.*known: A100-40GB"):
        mig_table(label)


def test_mig_instances_are_devices_of_their_profile() -> None:
    nodes = [
        node(
            "n1",
            {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
            {"nvidia.com/gpu.product": "H100-80GB-HBM3"},
        )
    ]
    pods = [pod("a", "n1", {"nvidia.com/mig-1g.10gb": "1"})]
    gpus = build_kube(nodes, pods, Mig()).nodes[0].gpus
    assert [(g.mig_profile, g.memory_bytes) for g in gpus] == [
        ("1g.10gb", 9984 * MiB),
        ("1g.10gb", 9984 * MiB),
        ("3g.40gb", 40448 * MiB),
    ]
    assert [len(g.allocations) for g in gpus] == [1, 0, 0]


def test_mig_instances_are_sized_by_the_nodes_product_label() -> None:
    nodes = [
        node("a100", {"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        node("h200", {"nvidia.com/mig-1g.18gb": "1"}, {"nvidia.com/gpu.product": "NVIDIA-H200"}),
    ]
    inventory = build_kube(nodes, [], Mig())
    sizes = [(g.node, g.mig_profile, g.memory_bytes // MiB) for g in inventory.gpus()]
    assert sizes == [("a100", "1g.10gb", 9728), ("h200", "1g.18gb", 17166)]  # 1g.10gb is not 9,537 MiB
    assert inventory.warnings == []


def test_mig_instances_of_an_unknown_product_are_left_out_with_a_warning_naming_the_label() -> None:
    nodes = [node("n1", {"nvidia.com/mig-1g.10gb": "2"}, {"nvidia.com/gpu.product": "NVIDIA-L40S"})]
    inventory = build_kube(nodes, [], Mig())
    assert list(inventory.gpus()) == []
    assert len(inventory.warnings) == 1
    assert "node n1" in inventory.warnings[0] and "nvidia.com/gpu.product='NVIDIA-L40S'" in inventory.warnings[0]
