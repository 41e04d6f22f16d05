"""Parse and validate a GPU request: a slice of one card, whole cards, or none.

Pure code: no I/O. The same rules serve the spawn form, the REST API
(`user_options`), the settings file and the benchmark.

A request is one of three kinds:

* CPU only: ``gpu_memory="0"`` and ``gpus=0``.
* A slice of one card: ``gpu_memory`` is an amount of memory ("4GiB", "4G",
  "4096MiB") or a share of a card ("0.25").
* Whole cards: ``gpus=N`` (``gpu_memory`` left at "0", or "1" meaning one card).

Amounts of memory ("4GiB", Kubernetes quantity rules) are read by the sizes package,
below every other (the markets read them too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from sizes import (
    MAX_INPUT_CHARS,
    QUANTITY,
    GiB,
    MiB,
    SizeError,
    decimal_of,
    format_bytes,
    parse_quantity,
    quantity_text,
    refuse_long,
    unit_hint,
)

__all__ = [  # the sizes' names too: a GPU request's callers read sizes from here
    "CPU_ONLY",
    "DEFAULT_SMALLEST_SLICE",
    "EXAMPLES",
    "MAX_INPUT_CHARS",
    "GiB",
    "GpuRequest",
    "MiB",
    "RequestKind",
    "ShareError",
    "format_bytes",
    "parse_gpu_memory",
    "parse_gpus",
    "parse_quantity",
    "parse_request",
    "quantity_text",
    "slice_choices",
]

EXAMPLES = '"4GiB", "512MiB", "0.25" (a quarter of a card) or "0" for CPU only'

# The smallest slice a server may ask for unless the settings say otherwise: CUDA's own
# context takes a few hundred MiB before a framework allocates anything, so a slice
# smaller than this would show the card to a notebook while charging almost nothing.
DEFAULT_SMALLEST_SLICE = 256 * MiB

# One error type for every bad amount or request (the sizes parser raises it too); its
# message says what to type instead.
ShareError = SizeError


class RequestKind(StrEnum):
    CPU = "cpu"
    SLICE = "slice"
    WHOLE = "whole"


@dataclass(frozen=True)
class GpuRequest:
    """What a server asks for. Exactly one of the three kinds (see module doc).

    ``memory_bytes`` is set for a slice given as memory, ``fraction`` for a slice
    given as a share of a card, ``gpus`` for whole cards.
    """

    gpus: int = 0
    memory_bytes: int | None = None
    fraction: float | None = None

    @property
    def kind(self) -> RequestKind:
        if self.gpus > 0:
            return RequestKind.WHOLE
        if self.memory_bytes or self.fraction:
            return RequestKind.SLICE
        return RequestKind.CPU

    def bytes_on(self, card_bytes: int) -> int:
        """The memory this request takes on a card of ``card_bytes``."""
        if self.kind is RequestKind.WHOLE:
            return card_bytes
        if self.memory_bytes is not None:
            return self.memory_bytes
        if self.fraction is not None:
            return int(self.fraction * card_bytes)
        return 0

    def fraction_of(self, card_bytes: int) -> float:
        """The share of a card of ``card_bytes`` this request takes (0..1)."""
        if card_bytes <= 0:
            return 0.0
        return min(1.0, self.bytes_on(card_bytes) / card_bytes)

    def describe(self) -> str:
        """Words for people: "4 GiB of one GPU", "a quarter of one GPU", "2 whole GPUs"."""
        if self.kind is RequestKind.WHOLE:
            return f"{self.gpus} whole GPU{'s' if self.gpus > 1 else ''}"
        if self.memory_bytes is not None:
            return f"{format_bytes(self.memory_bytes)} of one GPU"
        if self.fraction is not None:
            return f"{self.fraction:g} of one GPU"
        return "no GPU (CPU only)"


CPU_ONLY = GpuRequest()


def parse_gpu_memory(value: object) -> GpuRequest:
    """One ``gpu_memory`` value (text or number) as a request, before card limits.

    A bare number is a share of a card: 0 is CPU only, 0.25 a quarter, 1 a whole card.
    An amount with a unit is memory. Anything else raises ShareError.
    """
    if isinstance(value, bool) or value is None:
        raise ShareError(f"gpu_memory must be text or a number, not {value!r}; type {EXAMPLES}.")
    if isinstance(value, int) and value > 64:  # float() of a huge int overflows: refuse before converting
        return _share_from_number(_BEYOND_ADVICE, _short_repr(value))
    if isinstance(value, int | float):
        return _share_from_number(float(value), repr(value))
    if not isinstance(value, str):
        raise ShareError(f"gpu_memory must be text or a number, not {type(value).__name__}; type {EXAMPLES}.")
    text = value.strip()
    refuse_long(text, "an amount of GPU memory", EXAMPLES)
    if not text:
        return CPU_ONLY
    if text.startswith("-"):
        raise ShareError(f"GPU memory cannot be negative ({text!r}); type {EXAMPLES}.")
    if text.lower() in {"nan", "inf", "infinity", "+inf"}:
        raise ShareError(f"{text!r} is not an amount of GPU memory; type {EXAMPLES}.")
    match = QUANTITY.match(text)
    if match is None:
        hint = unit_hint(text)
        raise ShareError(f"{text!r} is not an amount of GPU memory{hint}; type for example {EXAMPLES}.")
    if not match["unit"] and not match["b"]:
        number = decimal_of(match)
        return _share_from_number(_BEYOND_ADVICE if number is None else float(number), repr(text))
    amount = parse_quantity(text)
    return GpuRequest(memory_bytes=amount) if amount else CPU_ONLY


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_INPUT_CHARS else f"a number of {len(text)} digits"


def _share_from_number(number: float, shown: str) -> GpuRequest:
    if math.isnan(number) or math.isinf(number):
        raise ShareError(f"{shown} is not an amount of GPU memory; type {EXAMPLES}.")
    if number < 0:
        raise ShareError(f"GPU memory cannot be negative ({shown}); type {EXAMPLES}.")
    if number == 0:
        return CPU_ONLY
    if number == 1:
        return GpuRequest(gpus=1)
    if number > 1:
        raise ShareError(
            f"A number without a unit is a share of one card, from 0 to 1; {shown} is more than a card. "
            f"{_more_than_a_card_advice(number)}"
        )
    return GpuRequest(fraction=number)


_BEYOND_ADVICE = 1e9  # a share so large that no unit or card count would make sense of it


def _more_than_a_card_advice(number: float) -> str:
    if number > 64:  # no amount of memory in GiB nor count of cards: say the ranges
        return 'Type a share from 0 to 1 ("0.25"), an amount with a unit ("4GiB") or whole cards with gpus=1.'
    return f'For memory add a unit ("{number:g}GiB"); for whole cards ask for gpus={math.ceil(number)}.'


def parse_gpus(value: object) -> int:
    """The whole-card count: a non-negative integer (text or number)."""
    if isinstance(value, bool):
        raise ShareError(f"gpus must be a whole number of cards, not {value!r}.")
    if isinstance(value, str):
        text = value.strip() or "0"
        refuse_long(text, "a number of cards", "0, 1 or 2")
        if not re.fullmatch(r"\+?[0-9]+", text):
            raise ShareError(f"gpus must be a whole number of cards such as 0, 1 or 2, not {value!r}.")
        return int(text)
    if isinstance(value, int):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    else:
        raise ShareError(f"gpus must be a whole number of cards such as 0, 1 or 2, not {value!r}.")
    if count < 0:
        raise ShareError(f"gpus cannot be negative ({count}); use 0 for a slice or a CPU-only server.")
    return count


def parse_request(
    gpu_memory: object = "0",
    gpus: object = 0,
    *,
    largest_card_bytes: int | None = None,
    most_cards: int | None = None,
    smallest_slice_bytes: int = DEFAULT_SMALLEST_SLICE,
) -> GpuRequest:
    """Combine ``gpu_memory`` and ``gpus`` into one request and check it against the cards.

    ``largest_card_bytes`` is the memory of the largest card a request could go to,
    ``most_cards`` the most cards one server can get (a node's GPU count); when given,
    requests beyond them are refused here with the numbers. A slice smaller than
    ``smallest_slice_bytes`` (on the largest card, for a share) is refused too.
    """
    count = parse_gpus(gpus)
    share = parse_gpu_memory(gpu_memory)
    if count and share.kind is RequestKind.SLICE:
        raise ShareError(
            f"Ask for either a slice of one GPU (gpu_memory={gpu_memory!r}) or whole GPUs (gpus={count}), "
            'not both: set gpu_memory to "0" to get whole cards, or gpus to 0 to get a slice.'
        )
    if count and share.kind is RequestKind.WHOLE and count != share.gpus:
        raise ShareError(f'gpu_memory="1" means one whole card but gpus={count}; set gpu_memory to "0".')
    request = GpuRequest(gpus=count) if count else share
    _check_limits(request, largest_card_bytes, most_cards)
    _check_floor(request, largest_card_bytes, smallest_slice_bytes)
    return request


def _check_floor(request: GpuRequest, largest_card_bytes: int | None, smallest: int) -> None:
    """A slice below ``smallest`` would show a card while charging almost nothing: refuse it."""
    if request.kind is not RequestKind.SLICE:
        return
    if request.memory_bytes is not None:
        asked = request.memory_bytes
    elif largest_card_bytes:
        asked = request.bytes_on(largest_card_bytes)
    else:
        return  # a share with no card to measure it against: the caller refuses it as "no GPU"
    if asked < smallest:
        raise ShareError(
            f"{request.describe()} is below the smallest slice, {format_bytes(smallest)}; "
            f'ask for "{quantity_text(smallest)}" or more, or "0" for CPU only.'
        )


def _check_limits(request: GpuRequest, largest_card_bytes: int | None, most_cards: int | None) -> None:
    if request.kind is RequestKind.WHOLE and most_cards is not None and request.gpus > most_cards:
        raise ShareError(
            f"{_short_repr(request.gpus)} whole GPUs is more than any machine has (at most {most_cards}); "
            f"ask for gpus={most_cards} or fewer."
        )
    asked, largest = request.memory_bytes, largest_card_bytes
    if asked is not None and largest is not None and asked > largest:
        raise ShareError(
            f"{format_bytes(asked)} is more than any GPU here has (the largest has {format_bytes(largest)}); "
            f"ask for {format_bytes(largest)} or less, or for whole cards with gpus=1."
        )


def slice_choices(ceiling: int) -> list[int]:
    """Slice sizes to offer: powers of two from 0.5 GiB up to ``ceiling``, and the ceiling itself."""
    choices, size = [], GiB // 2
    while size <= ceiling:
        choices.append(size)
        size *= 2
    if ceiling and (not choices or choices[-1] != ceiling):
        choices.append(ceiling)
    return choices
