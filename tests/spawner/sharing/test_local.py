import pytest

from spawner.shares import GiB, GpuRequest
from spawner.sharing.base import Target
from spawner.sharing.local import Local

FOUR_GIB = GpuRequest(memory_bytes=4 * GiB)


def test_local_backend_pins_the_chosen_card() -> None:
    spec = Local().render(FOUR_GIB, Target(card_bytes=16 * GiB, devices=("1",)))
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert spec.env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.250000"
    assert spec.limits == {} and spec.annotations == {}
    whole = Local().render(GpuRequest(gpus=2), Target(devices=("0", "2")))
    assert whole.env["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_local_backend_needs_one_device_per_card() -> None:
    with pytest.raises(ValueError, match="needs 2 device"):
        Local().render(GpuRequest(gpus=2), Target(devices=("0",)))
