"""Amounts of memory as people type them ("4GiB", "512MiB", "16G") and as people read them.

Pure code below every package: the GPU request parser (spawner/shares.py), the group
rules (spawner/quotas.py), the settings and the markets' catalogs (market/catalog.py)
all read sizes here, so that none of them has to import another for it.

Units follow Kubernetes quantity rules: binary suffixes ``Ki Mi Gi Ti Pi Ei`` are powers
of 1024, decimal suffixes ``k M G T P E`` powers of 1000. A trailing ``B`` is accepted
("4GiB", "4GB") because people type it.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

MiB = 1024**2
GiB = 1024**3

QUANTITY = re.compile(
    r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]+))?"
    r"\s*(?P<unit>[KMGTPE]i|[kKMGTPE])?(?P<b>[bB])?\s*$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

# Longer text is no amount anyone means ("16GiB", "0.25", "1e3Mi"); refusing it first
# keeps Decimal and int() away from million-digit input.
MAX_INPUT_CHARS = 32
# More memory than any GPU will have; larger amounts are refused before arithmetic.
MAX_EXPONENT = 30
# Stands for "more than any card": larger than any real GPU's memory, small enough for arithmetic.
TOO_MANY_BYTES = 2**63


class SizeError(ValueError):
    """An amount (or a GPU request made of amounts) that cannot be used; the message says what to type."""


def parse_quantity(text: str) -> int:
    """A Kubernetes-style memory quantity in bytes, rounded up to a whole byte.

    >>> parse_quantity("4Gi"), parse_quantity("4G"), parse_quantity("1.5MiB")
    (4294967296, 4000000000, 1572864)
    """
    refuse_long(text, "an amount of memory", "16GiB or 512MiB")
    match = QUANTITY.match(text)
    if not match:
        raise SizeError(f"{text!r} is not an amount of memory{unit_hint(text)}; write for example 16GiB or 512MiB.")
    number = decimal_of(match)
    if number is None:
        return TOO_MANY_BYTES
    unit = match["unit"] or ""
    if unit in _BINARY:
        number *= Decimal(1024) ** _BINARY[unit]
    elif unit in _DECIMAL:
        number *= Decimal(1000) ** _DECIMAL[unit]
    return math.ceil(number)


def decimal_of(match: re.Match[str]) -> Decimal | None:
    """The number a QUANTITY match spells, or None when its exponent puts it beyond any card.

    An exponent far below zero gives Decimal zero's neighbourhood, not zero: the caller
    refuses it as below the smallest slice rather than reading it as CPU only.
    """
    exponent = int(match["exp"] or 0)  # at most MAX_INPUT_CHARS digits: int() is safe
    if exponent > MAX_EXPONENT:
        return None
    try:
        return Decimal(match["number"]).scaleb(max(exponent, -MAX_EXPONENT - 10))
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        return None


def refuse_long(text: str, what: str, example: str) -> None:
    if len(text) > MAX_INPUT_CHARS:
        raise SizeError(
            f"{text[:12]!r}... is {len(text)} characters long, which is not {what}; "
            f"type at most {MAX_INPUT_CHARS} characters, for example {example}."
        )


def unit_hint(text: str) -> str:
    unit = re.sub(r"^[\s0-9.eE+-]+", "", text)
    if not unit:
        return ""
    return f" (unknown unit {unit!r}; use Ki, Mi, Gi or k, M, G, optionally followed by B)"


def format_bytes(n: int | float) -> str:
    """Binary units, shortest exact-ish form: 4294967296 -> "4 GiB"."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def quantity_text(n: int) -> str:
    """Bytes as a quantity people can type back: 268435456 -> "256MiB"."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if n and n % 1024**power == 0:
            return f"{n // 1024**power}{unit}"
    return str(n)
