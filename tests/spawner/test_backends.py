import pytest

from spawner.backends import (
    MIG_PROFILES,
    NO_ISOLATION_WARNING,
    Backend,
    Isolation,
    MigProductError,
    MigProfile,
    gpushare_card_units,
    mig_card,
    mig_table,
    render,
    smallest_mig_profile,
)
from spawner.shares import CPU_ONLY, GiB, GpuRequest, MiB, ShareError

T4 = 15360 * MiB  # what NVML reports for a 16 GB T4
V100_16 = 16160 * MiB
FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)
QUARTER = GpuRequest(fraction=0.25)


@pytest.mark.parametrize("backend", list(Backend))
def test_cpu_only_servers_see_no_gpu_on_every_backend(backend: Backend) -> None:
    spec = render(CPU_ONLY, backend, card_bytes=T4)
    assert spec.env == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    assert spec.limits == {}


def test_gpushare_memory_rounds_up_to_whole_gib() -> None:
    spec = render(GpuRequest(memory_bytes=3 * GiB + 1), Backend.GPUSHARE, card_bytes=V100_16)
    assert spec.limits == {"aliyun.com/gpu-mem": "4"}
    assert spec.annotations == {
        "gpuslice.io/gpu-memory-bytes": str(4 * GiB),
        "gpuslice.io/sharing-backend": "gpushare",
    }
    assert spec.env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert spec.env["GPUSLICE_ISOLATION"] == "none"
    assert spec.warnings == (NO_ISOLATION_WARNING,)


def test_gpushare_counts_a_16gb_card_as_15_gib() -> None:
    assert gpushare_card_units(V100_16) == 15
    # A quarter of 15 GiB rounds down so that four quarters fit on the card.
    assert render(QUARTER, Backend.GPUSHARE, card_bytes=V100_16).limits == {"aliyun.com/gpu-mem": "3"}


def test_gpushare_with_memory_unit_mib_asks_in_mib() -> None:
    """gpushare's device plugin with --memory-unit=MiB offers one aliyun.com/gpu-mem per MiB."""
    spec = render(GpuRequest(memory_bytes=4 * GiB + 1), Backend.GPUSHARE, gpushare_memory_unit="MiB")
    assert spec.limits == {"aliyun.com/gpu-mem": "4097"}
    assert spec.annotations["gpuslice.io/gpu-memory-bytes"] == str(4097 * 2**20)
    assert gpushare_card_units(V100_16, "MiB") == V100_16 // 2**20
    quarter = render(QUARTER, Backend.GPUSHARE, card_bytes=V100_16, gpushare_memory_unit="MiB")
    assert quarter.limits == {"aliyun.com/gpu-mem": str(V100_16 // 2**20 // 4)}
    with pytest.raises(ValueError, match="--memory-unit"):
        render(FOUR_GIB, Backend.GPUSHARE, gpushare_memory_unit="GB")


def test_gpushare_share_without_a_card_size_asks_for_memory() -> None:
    with pytest.raises(ShareError, match='ask for memory instead, for example "4GiB"'):
        render(QUARTER, Backend.GPUSHARE)


def test_slice_env_carries_bytes_and_fraction_when_the_card_is_known() -> None:
    env = render(FOUR_GIB, Backend.TIMESLICING, card_bytes=16 * GiB).env
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.250000"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250000"
    assert "GPUSLICE_GPU_MEMORY_FRACTION" not in render(FOUR_GIB, Backend.TIMESLICING).env


def test_hami_uses_mib_and_optional_cores() -> None:
    spec = render(GpuRequest(memory_bytes=4 * GiB + 1), Backend.HAMI, hami_cores_percent=30)
    assert spec.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4097", "nvidia.com/gpucores": "30"}
    assert spec.isolation is Isolation.SOFTWARE
    assert spec.warnings == ()


def test_hami_share_uses_the_memory_percentage() -> None:
    spec = render(QUARTER, Backend.HAMI, card_bytes=16 * GiB)
    assert spec.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}
    assert spec.env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)


def test_hami_refuses_impossible_core_share() -> None:
    with pytest.raises(ShareError, match="1 to 100"):
        render(FOUR_GIB, Backend.HAMI, hami_cores_percent=150)


def test_timeslicing_warns_there_is_no_isolation() -> None:
    spec = render(FOUR_GIB, Backend.TIMESLICING, card_bytes=16 * GiB)
    assert spec.limits == {"nvidia.com/gpu.shared": "1"}
    assert spec.isolation is Isolation.NONE
    assert "without memory isolation" in spec.warnings[0]
    assert render(FOUR_GIB, Backend.TIMESLICING, timeslicing_resource="nvidia.com/gpu").limits == {
        "nvidia.com/gpu": "1"
    }


@pytest.mark.parametrize(
    ("asked", "profile"),
    [(1 * GiB, "1g.5gb"), (4 * GiB, "1g.5gb"), (5 * GiB, "2g.10gb"), (12 * GiB, "3g.20gb"), (30 * GiB, "7g.40gb")],
)
def test_mig_takes_the_smallest_profile_that_holds_the_request(asked: int, profile: str) -> None:
    spec = render(GpuRequest(memory_bytes=asked), Backend.MIG, mig_profiles=MIG_PROFILES["A100-40GB"])
    assert spec.limits == {f"nvidia.com/mig-{profile}": "1"}
    assert spec.isolation is Isolation.HARDWARE


def test_mig_prefers_fewer_compute_slices_among_equal_memory() -> None:
    profiles = (MigProfile("4g.20gb", 19968, 4), MigProfile("3g.20gb", 19968, 3))
    assert smallest_mig_profile(15 * GiB, profiles).name == "3g.20gb"


def test_mig_refuses_more_than_the_largest_instance() -> None:
    with pytest.raises(ShareError, match=r"largest MIG instance here \(7g.40gb"):
        render(GpuRequest(memory_bytes=60 * GiB), Backend.MIG, mig_profiles=MIG_PROFILES["A100-40GB"])


def test_mig_share_resolves_against_the_card() -> None:
    h100 = MIG_PROFILES["H100-80GB"]
    # A fifth of 80 GiB (16 GiB) fits 1g.20gb (fewer compute slices than 2g.20gb) ...
    spec = render(GpuRequest(fraction=0.2), Backend.MIG, card_bytes=80 * GiB, mig_profiles=h100)
    assert spec.limits == {"nvidia.com/mig-1g.20gb": "1"}
    # ... but a quarter (20 GiB) does not: 1g.20gb really offers 19.5 GiB.
    spec = render(QUARTER, Backend.MIG, card_bytes=80 * GiB, mig_profiles=h100)
    assert spec.limits == {"nvidia.com/mig-3g.40gb": "1"}


def test_whole_cards_on_every_sharing_backend_ask_for_nvidia_gpu() -> None:
    for backend in (Backend.GPUSHARE, Backend.HAMI, Backend.TIMESLICING, Backend.MIG, Backend.WHOLE):
        assert render(GpuRequest(gpus=2), backend).limits == {"nvidia.com/gpu": "2"}


def test_whole_backend_refuses_slices_with_advice() -> None:
    with pytest.raises(ShareError, match="whole GPUs only; ask for gpus=1"):
        render(FOUR_GIB, Backend.WHOLE)


def test_local_backend_pins_the_chosen_card() -> None:
    spec = render(FOUR_GIB, Backend.LOCAL, card_bytes=16 * GiB, devices=("1",))
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert spec.env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.250000"
    assert spec.limits == {} and spec.annotations == {}
    whole = render(GpuRequest(gpus=2), Backend.LOCAL, devices=("0", "2"))
    assert whole.env["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_local_backend_needs_one_device_per_card() -> None:
    with pytest.raises(ValueError, match="needs 2 device"):
        render(GpuRequest(gpus=2), Backend.LOCAL, devices=("0",))


def test_builders_return_fresh_dicts() -> None:
    first = render(FOUR_GIB, Backend.TIMESLICING, card_bytes=16 * GiB)
    first.env["MUTATED"] = "1"
    assert "MUTATED" not in render(FOUR_GIB, Backend.TIMESLICING, card_bytes=16 * GiB).env


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
    spec = render(GpuRequest(memory_bytes=9 * GiB), Backend.MIG, mig_profiles=table)
    assert spec.limits == {"nvidia.com/mig-1g.10gb": "1"}


def test_the_same_request_takes_each_cards_own_smallest_profile() -> None:
    request = GpuRequest(memory_bytes=4 * GiB)
    chosen = {
        label: next(iter(render(request, Backend.MIG, mig_profiles=mig_table(label)).limits))
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
