import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.shares import (
    CPU_ONLY,
    GiB,
    GpuRequest,
    MiB,
    RequestKind,
    ShareError,
    format_bytes,
    parse_gpu_memory,
    parse_gpus,
    parse_quantity,
    parse_request,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4Gi", 4 * GiB),
        ("4GiB", 4 * GiB),
        ("4 GiB", 4 * GiB),
        ("4G", 4 * 10**9),
        ("4GB", 4 * 10**9),
        ("4096Mi", 4 * GiB),
        ("4096MiB", 4 * GiB),
        ("512M", 512 * 10**6),
        ("1.5Gi", 3 * GiB // 2),
        ("1e3Mi", 1000 * MiB),
        ("2k", 2000),
        ("1Ki", 1024),
        ("1Ti", 1024**4),
    ],
)
def test_parse_quantity_follows_kubernetes_units(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


def test_parse_quantity_rounds_fractional_bytes_up() -> None:
    assert parse_quantity("0.5") == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4GiB", GpuRequest(memory_bytes=4 * GiB)),
        ("512MiB", GpuRequest(memory_bytes=512 * MiB)),
        ("0.25", GpuRequest(fraction=0.25)),
        (0.5, GpuRequest(fraction=0.5)),
        ("0", CPU_ONLY),
        (0, CPU_ONLY),
        ("", CPU_ONLY),
        ("0GiB", CPU_ONLY),
        ("1", GpuRequest(gpus=1)),
        (1, GpuRequest(gpus=1)),
    ],
)
def test_parse_gpu_memory(value: object, expected: GpuRequest) -> None:
    assert parse_gpu_memory(value) == expected


@pytest.mark.parametrize(
    ("value", "advice"),
    [
        ("-4GiB", "cannot be negative"),
        (-0.5, "cannot be negative"),
        ("nan", "not an amount"),
        (float("nan"), "not an amount"),
        (float("inf"), "not an amount"),
        ("4 bananas", "unknown unit 'bananas'"),
        ("4gib", "unknown unit"),
        ("four", "not an amount"),
        ("4", 'add a unit ("4GiB")'),
        (16, "gpus=16"),
        (True, "text or a number"),
        (None, "text or a number"),
        ([4], "not list"),
    ],
)
def test_bad_gpu_memory_says_what_to_type(value: object, advice: str) -> None:
    with pytest.raises(ShareError) as error:
        parse_gpu_memory(value)
    assert advice in str(error.value)


def test_every_error_suggests_an_example() -> None:
    with pytest.raises(ShareError, match=r'"4GiB"'):
        parse_gpu_memory("lots")


@pytest.mark.parametrize(("value", "expected"), [(0, 0), ("2", 2), (3.0, 3), ("", 0), ("+1", 1)])
def test_parse_gpus(value: object, expected: int) -> None:
    assert parse_gpus(value) == expected


@pytest.mark.parametrize("value", [-1, "-1", 1.5, "two", True, None, "1.0"])
def test_parse_gpus_refuses_non_counts(value: object) -> None:
    with pytest.raises(ShareError, match="gpus"):
        parse_gpus(value)


def test_slice_and_whole_cards_together_are_refused() -> None:
    with pytest.raises(ShareError, match=r"either a slice of one GPU .* or whole GPUs"):
        parse_request("4GiB", 2)


def test_one_card_as_memory_and_gpus_agree() -> None:
    assert parse_request("1", 1) == GpuRequest(gpus=1)
    with pytest.raises(ShareError, match='set gpu_memory to "0"'):
        parse_request("1", 2)


def test_whole_cards_with_zero_memory() -> None:
    assert parse_request("0", 2).kind is RequestKind.WHOLE


def test_more_than_the_largest_card_is_refused_with_the_numbers() -> None:
    with pytest.raises(ShareError, match=r"largest has 16 GiB\); ask for 16 GiB or less"):
        parse_request("20GiB", largest_card_bytes=16 * GiB)
    assert parse_request("16GiB", largest_card_bytes=16 * GiB).memory_bytes == 16 * GiB


def test_more_cards_than_a_machine_has_is_refused() -> None:
    with pytest.raises(ShareError, match="at most 4"):
        parse_request("0", 8, most_cards=4)


def test_request_resolves_against_a_card() -> None:
    quarter = GpuRequest(fraction=0.25)
    assert quarter.bytes_on(16 * GiB) == 4 * GiB
    assert quarter.fraction_of(16 * GiB) == 0.25
    assert GpuRequest(memory_bytes=4 * GiB).fraction_of(16 * GiB) == 0.25
    assert GpuRequest(gpus=2).bytes_on(16 * GiB) == 16 * GiB
    assert CPU_ONLY.bytes_on(16 * GiB) == 0


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (GpuRequest(memory_bytes=4 * GiB), "4 GiB of one GPU"),
        (GpuRequest(fraction=0.25), "0.25 of one GPU"),
        (GpuRequest(gpus=2), "2 whole GPUs"),
        (CPU_ONLY, "no GPU (CPU only)"),
    ],
)
def test_describe(request_: GpuRequest, words: str) -> None:
    assert request_.describe() == words


def test_format_bytes() -> None:
    assert format_bytes(4 * GiB) == "4 GiB"
    assert format_bytes(1536 * MiB) == "1.5 GiB"
    assert format_bytes(100) == "100 B"


@given(st.one_of(st.text(max_size=20), st.floats(allow_nan=True), st.integers(), st.none(), st.booleans()))
def test_parsing_never_fails_other_than_with_share_error(value: object) -> None:
    try:
        request = parse_request(value, 0, largest_card_bytes=80 * GiB)
    except ShareError as error:
        assert str(error)
        return
    assert request.kind in set(RequestKind)
    if request.memory_bytes is not None:
        assert 0 < request.memory_bytes <= 80 * GiB
    if request.fraction is not None:
        assert 0 < request.fraction < 1 and not math.isnan(request.fraction)


# -- the floor and the ceiling: tiny, huge and absurd numbers (issue 13) ------------------

HUGE = "9" * 1_000_000


@pytest.mark.parametrize(
    ("gpu_memory", "advice"),
    [
        ("0.0000001", 'smallest slice, 256 MiB; ask for "256MiB" or more'),
        ("1e-400", 'smallest slice, 256 MiB; ask for "256MiB" or more'),
        ("1e-400GiB", 'smallest slice, 256 MiB; ask for "256MiB" or more'),
        ("1MiB", 'smallest slice, 256 MiB; ask for "256MiB" or more'),
        ("1", None),
        ("255MiB", "256MiB"),
        (1e-300, "smallest slice"),
    ],
)
def test_a_slice_below_the_smallest_is_refused_never_cpu_only(gpu_memory: object, advice: str | None) -> None:
    if advice is None:
        assert parse_request(gpu_memory, largest_card_bytes=16 * GiB).kind is RequestKind.WHOLE
        return
    with pytest.raises(ShareError) as error:
        parse_request(gpu_memory, largest_card_bytes=16 * GiB)
    assert advice in str(error.value)
    assert '"0" for CPU only' in str(error.value)


def test_the_smallest_slice_is_configurable() -> None:
    assert parse_request("64MiB", largest_card_bytes=16 * GiB, smallest_slice_bytes=64 * MiB).memory_bytes == 64 * MiB
    with pytest.raises(ShareError, match='ask for "1GiB" or more'):
        parse_request("0.05", largest_card_bytes=16 * GiB, smallest_slice_bytes=GiB)
    assert parse_request("256MiB", largest_card_bytes=16 * GiB).memory_bytes == 256 * MiB


@pytest.mark.parametrize(
    ("gpu_memory", "gpus", "advice"),
    [
        ("1e400", 0, "more than a card"),
        ("1e400GiB", 0, "more than any GPU here has"),
        ("1e999999999GiB", 0, "more than any GPU here has"),
        (HUGE, 0, "characters long"),
        (HUGE + "GiB", 0, "characters long"),
        ("0." + "0" * 100 + "1", 0, "characters long"),
        (10**400, 0, "more than a card"),
        ("0", HUGE, "characters long"),
        ("0", 10**400, "more than any machine has"),
    ],
    ids=[
        "1e400",
        "1e400GiB",
        "huge-exponent",
        "million-digits",
        "million-digits-GiB",
        "long-fraction",
        "int-10^400",
        "gpus-million-digits",
        "gpus-10^400",
    ],
)
def test_overflow_and_absurd_input_say_what_to_type(gpu_memory: object, gpus: object, advice: str) -> None:
    with pytest.raises(ShareError) as error:
        parse_request(gpu_memory, gpus, largest_card_bytes=16 * GiB, most_cards=2)
    assert advice in str(error.value)
    assert len(str(error.value)) < 400  # the message never repeats a huge input
