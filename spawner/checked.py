"""What people write (the settings file, the chart's values, group rules) as pydantic models
that refuse a wrong key or value in one clear sentence.

Pure code. ``Checked`` refuses a key it does not know with its likely fix ("did you mean
port?") instead of pydantic's "Extra inputs are not permitted"; the annotated types below
(``Port``, ``Seconds``, ``Amount``, ...) say what to write instead of pydantic's type names;
``problems`` puts a ValidationError in one line naming each key.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, WithJsonSchema, model_validator

from sizes import QUANTITY, SizeError, parse_quantity


def unknown_keys_message(unknown: Sequence[str], known: Sequence[str]) -> str:
    """ "unknown key(s) colr (did you mean colour?); use ...": a typo gets its likely fix."""
    guesses = [
        f"{k} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(k, known, 1)) else k for k in unknown
    ]
    return f"unknown key(s) {', '.join(guesses)}; use {', '.join(sorted(known))}"


class Checked(BaseModel):
    """A frozen model of keys people write; an unknown key is refused with a suggestion, never ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # Keys a before-validator of the subclass reads itself (not fields): they are known too.
    extra_keys: ClassVar[tuple[str, ...]] = ()
    # Fields that are not keys of the file (set by the reader, e.g. where the settings came from).
    not_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys a file may have, spelled as the file spells them (aliases where there are)."""
        fields = [f.alias or name for name, f in cls.model_fields.items() if name not in cls.not_keys]
        return tuple(sorted({*fields, *cls.extra_keys}))

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = cls.keys()
            names = set(cls.model_fields)  # Python callers may use the field names too
            unknown = sorted(str(k) for k in data if k not in known and k not in names)
            if unknown:
                raise ValueError(unknown_keys_message(unknown, known))
        return data


def problems(exc: ValidationError, where: str = "") -> str:
    """A ValidationError in one line for people: "key.path must be ...; other.key: what is wrong"."""
    parts = []
    for error in exc.errors():
        loc = ".".join([*([where] if where else []), *(str(p) for p in error["loc"])])
        msg = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if not loc:
            parts.append(msg)
        elif msg.startswith(("must ", "needs ")):
            parts.append(f"{loc} {msg}")
        else:
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _port(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"must be a number from 1 to 65535, not {value!r}")
    return value


def _port_or_zero(value: Any) -> Any:
    return value if value == 0 and not isinstance(value, bool) else _port(value)


def _seconds(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"must be a whole number of seconds above 0, not {value!r}")
    return value


def _count(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError("must be a whole number, 0 or more")
    return value


def _positive(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"must be a whole number above 0, not {value!r}")
    return value


def _flag(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _text(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be text")
    return value


def _names(value: Any) -> Any:
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) and m for m in value):
        raise ValueError("must be a list of user names")
    return tuple(value)


def _list_of_names(value: Any) -> Any:
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
        raise ValueError("must be a list of names")
    return tuple(value)


def _amount(value: Any) -> Any:
    """An amount of memory above 0, as text ("256MiB")."""
    try:
        if not isinstance(value, str):
            raise SizeError(f"a {type(value).__name__} is not an amount of memory.")
        if parse_quantity(value) <= 0:
            raise SizeError(f"{value!r} is not an amount of memory above 0.")
    except SizeError as exc:
        raise ValueError(f"{exc} Write for example 256MiB.") from None
    return value


def _limit(value: Any) -> Any:
    """An amount of memory a rule allows (0 allowed: none); a number is read as bytes' text as before."""
    if value is None:
        return None
    try:
        parse_quantity(str(value))
    except SizeError as exc:
        raise ValueError(str(exc)) from None
    return str(value)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|min|h)?\s*")
_SECONDS_PER = {None: 1, "s": 1, "min": 60, "h": 3600}
DURATION_PATTERN = r"^\s*[0-9.]+\s*(s|min|h)?\s*$"


MOST_DURATION_S = 7 * 24 * 3600  # a week: longer is a typo (and "9" * 400 would be infinite, or overflow)


def duration_seconds(value: Any) -> float:
    """Seconds from ``3600``, ``"45s"``, ``"90min"`` or ``"2h"``, at most a week; ValueError says how to write one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        number, unit = value, None
    else:
        found = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if found is None or float(found[1]) <= 0:
            raise ValueError(f"must be a duration such as 2h, 90min or 3600 (seconds), not {_shown(value)}")
        number, unit = float(found[1]), found[2]
    if not number * _SECONDS_PER[unit] <= MOST_DURATION_S:  # NaN and infinity too
        raise ValueError(f"must be at most 7 days (168h or {MOST_DURATION_S} seconds), not {_shown(value)}")
    return float(number * _SECONDS_PER[unit])


def _shown(value: Any) -> str:
    """A value in a message, cut short: whatever people send comes back in the answer."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _duration(value: Any) -> Any:
    if value is not None:
        duration_seconds(value)
    return value


def one_of(*allowed: str) -> Any:
    """Text that must be one of ``allowed`` (an enum in JSON schema)."""

    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, not {value!r}")
        return value

    return Annotated[str, BeforeValidator(check), WithJsonSchema({"enum": list(allowed)})]


def _url_or_empty(value: Any) -> Any:
    if not isinstance(value, str) or (value and not value.startswith(("http://", "https://"))):
        raise ValueError(f"must be an http(s) URL or empty, not {value!r}")
    return value


UrlOrEmpty = Annotated[
    str, BeforeValidator(_url_or_empty), WithJsonSchema({"type": "string", "pattern": "^(https?://.+)?$"})
]


# An amount of memory as JSON schema (the chart's values.schema.json): sizes.QUANTITY without its group names.
AMOUNT_PATTERN = re.sub(r"\?P<\w+>", "", QUANTITY.pattern)

# Each type with the JSON schema that says the same (helm checks the chart's values with it).
Port = Annotated[int, BeforeValidator(_port), WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 65535})]
PortOrZero = Annotated[
    int, BeforeValidator(_port_or_zero), WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 65535})
]
Seconds = Annotated[int, BeforeValidator(_seconds), WithJsonSchema({"type": "integer", "minimum": 1})]
Count = Annotated[int | None, BeforeValidator(_count), WithJsonSchema({"type": "integer", "minimum": 0})]
PositiveInt = Annotated[int, BeforeValidator(_positive), WithJsonSchema({"type": "integer", "minimum": 1})]
Flag = Annotated[bool, BeforeValidator(_flag), WithJsonSchema({"type": "boolean"})]
Text = Annotated[str, BeforeValidator(_text), WithJsonSchema({"type": "string"})]
UserNames = Annotated[
    tuple[str, ...],
    BeforeValidator(_names),
    WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1}}),
]
Names = Annotated[
    tuple[str, ...], BeforeValidator(_list_of_names), WithJsonSchema({"type": "array", "items": {"type": "string"}})
]
Amount = Annotated[str, BeforeValidator(_amount), WithJsonSchema({"type": "string", "pattern": AMOUNT_PATTERN})]
Limit = Annotated[str | None, BeforeValidator(_limit), WithJsonSchema({"type": "string", "pattern": AMOUNT_PATTERN})]
Duration = Annotated[
    str | int | None,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "integer", "minimum": 1, "maximum": MOST_DURATION_S},
            ]
        }
    ),
]
