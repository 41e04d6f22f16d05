import pytest

from spawner.gpus import parse_gpu_spec, simulated_gpus
from spawner.shares import GiB


def test_spec_with_models() -> None:
    entries = parse_gpu_spec("2x16GiB:T4,1x80GiB:H100")
    assert [(e.count, e.memory_bytes, e.model) for e in entries] == [(2, 16 * GiB, "T4"), (1, 80 * GiB, "H100")]
    assert str(entries[0]) == "2x16GiB:T4"


def test_model_is_optional() -> None:
    assert parse_gpu_spec("1x24Gi")[0].model == "simulated"


@pytest.mark.parametrize(
    ("spec", "message"),
    [("", "empty"), ("two cards", "COUNTxSIZE"), ("2x16 bananas", "unknown unit"), ("0x16GiB", "at least one card")],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_gpu_spec(spec)


def test_simulated_gpus_are_indexed_and_marked() -> None:
    gpus = simulated_gpus("2x16GiB:T4,1x80GiB:H100")
    assert [(g.index, g.model, g.simulated) for g in gpus] == [(0, "T4", True), (1, "T4", True), (2, "H100", True)]
    assert len({g.uuid for g in gpus}) == 3
