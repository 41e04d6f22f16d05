"""Label and field selectors as the API server parses and applies them.

Labels: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``, comma-joined
(all must hold). Fields: ``a=b``, ``a==b``, ``a!=b`` over the fields a resource supports; any
other field is refused as the API server refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.kube.api.errors import bad_request

Obj = dict[str, Any]
ALWAYS = ("metadata.name", "metadata.namespace")
_SET = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


def _terms(selector: str) -> list[str]:
    """The selector's requirements: commas split them, except inside a set's parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def label_matcher(selector: str) -> Callable[[dict[str, str]], bool]:
    """A test of a labels map; a selector that does not parse is a 400, as the API server answers."""
    tests: list[Callable[[dict[str, str]], bool]] = []
    for term in _terms(selector):
        if found := _SET.match(term):
            key, op, values = found.group(1), found.group(2), {v.strip() for v in found.group(3).split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif found := _EQUALITY.match(term):
            key, op, value = found.groups()
            if op == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif found := _EXISTS.match(term):
            negated, key = found.group(1) == "!", found.group(2)
            tests.append(lambda labels, k=key, n=negated: (k in labels) != n)
        else:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected: in, notin, =, ==, !=")
    return lambda labels: all(test(labels) for test in tests)


def matches_labels(obj: Obj, selector: str) -> bool:
    return label_matcher(selector)(obj.get("metadata", {}).get("labels") or {})


def field_value(obj: Obj, path: str) -> str:
    current: Any = obj
    for part in path.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if isinstance(current, bool):
        return str(current).lower()
    return "" if current is None else str(current)


def field_matcher(selector: str, supported: tuple[str, ...]) -> Callable[[Obj], bool]:
    tests: list[Callable[[Obj], bool]] = []
    for term in _terms(selector):
        found = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not found:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        path, op, value = found.groups()
        if path not in ALWAYS and path not in supported:
            raise bad_request(f"field label not supported: {path}")
        if op == "!=":
            tests.append(lambda obj, p=path, v=value: field_value(obj, p) != v)
        else:
            tests.append(lambda obj, p=path, v=value: field_value(obj, p) == v)
    return lambda obj: all(test(obj) for test in tests)
