"""Metric names in PromQL, in prose, and in Grafana dashboards; Grafana's variable substitution.

A tokenizer, not a full parser: it skips strings, numbers, durations, label matchers and
label lists, and keeps the identifiers that are neither functions, aggregations nor
keywords. Those are metric names (PromQL has no other bare identifiers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from re import _parser as sre_parse  # the parse tree, to expand a regex's alternatives
from typing import Any

KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
    # aggregations, which may be followed by "by (...)" before their parenthesis
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile",
}  # fmt: skip
LABEL_LIST_AFTER = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<number>0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?[smhdwy]*)
    |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<open>[({])|(?P<close>[)}])
    |(?P<other>\S)""",
    re.VERBOSE,
)
NAME_MATCHER = re.compile(r"""__name__\s*(=~|=)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')""")


def names_in_promql(expr: str) -> set[str]:
    """Metric names an expression selects, ``{__name__=~"a|b"}`` matchers expanded."""
    names = {n for m in NAME_MATCHER.finditer(expr) for n in expand_regex(m[2][1:-1], literal=m[1] == "=")}
    tokens = [(m.lastgroup, m.group()) for m in TOKEN.finditer(NAME_MATCHER.sub("", expr))]
    depth_in_braces, skip_list, index = 0, False, 0
    stack: list[str] = []
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else ("", "")
        if kind == "open":
            stack.append("label-list" if skip_list else text)
            skip_list = False
            depth_in_braces += text == "{"
        elif kind == "close":
            opened = stack.pop() if stack else ""
            depth_in_braces -= opened == "{"
        elif kind == "name" and depth_in_braces == 0 and "label-list" not in stack:
            if text in LABEL_LIST_AFTER:
                skip_list = True
            elif text not in KEYWORDS and following[1] != "(":
                names.add(text)
        index += 1
    return names


def expand_regex(pattern: str, literal: bool = False) -> set[str]:
    """The finite set of names a regex of literals and alternatives matches."""
    if literal:
        return {pattern}

    def expand(parsed: Iterable[tuple[Any, Any]]) -> list[str]:
        results = [""]
        for op, value in parsed:
            if op is sre_parse.LITERAL:
                options = [chr(value)]
            elif op is sre_parse.SUBPATTERN:
                options = expand(value[-1])
            elif op is sre_parse.BRANCH:
                options = [s for branch in value[1] for s in expand(branch)]
            elif op is sre_parse.IN and all(o is sre_parse.LITERAL for o, _ in value):
                options = [chr(v) for _, v in value]
            else:
                raise ValueError(f"{pattern!r} is not a list of names; write each metric name out")
            results = [r + o for r in results for o in options]
        return results

    return set(expand(sre_parse.parse(pattern)))


# Prose (docs, Python strings, the chart): only names with gpuslice's and its sources'
# prefixes are unambiguous there; a name followed by ".py" or similar is a file.
PROSE_NAME = re.compile(
    r"(?<![\w/.-])(DCGM_FI_[A-Z0-9_]+|gpuslice:[a-z0-9_:]+|gpuslice_[a-z0-9_]+|jupyterhub_[a-z0-9_]+)(?![\w.-]*\.\w)"
)


def names_in_prose(text: str) -> set[str]:
    expanded = {n for m in NAME_MATCHER.finditer(text) for n in expand_regex(m[2][1:-1], literal=m[1] == "=")}
    return expanded | {m[1] for m in PROSE_NAME.finditer(NAME_MATCHER.sub("", text))}


# Grafana dashboards --------------------------------------------------------------------

LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<match>.+?)\s*,\s*(?P<label>\w+)\s*\)\s*$")


def variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "") if isinstance(query, dict) else query)


def grafana_variables(dashboard: dict[str, Any], label_values: Callable[[str, str], list[str]]) -> dict[str, str]:
    """Each query variable set to "All", as Grafana formats a multi-value variable for
    Prometheus: ``(v1|v2)``, values regex-escaped; or its allValue when it has one."""
    values: dict[str, str] = {"__rate_interval": "1m", "__interval": "15s"}  # Grafana's, for a 15s scrape
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        match = LABEL_VALUES.match(variable_query(variable))
        assert match, f"variable {variable['name']}: only label_values(metric, label) queries are supported"
        found = label_values(match["match"], match["label"])
        assert found, f"variable {variable['name']}: {variable_query(variable)} returned no values"
        if variable.get("includeAll") and variable.get("allValue"):
            values[variable["name"]] = variable["allValue"]
        else:
            # Escaped for a regex, then once more for the PromQL string it lands in.
            values[variable["name"]] = "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in found) + ")"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    def value(m: re.Match[str]) -> str:
        name = m["braced"] or m["plain"]
        assert name in values, f"unknown Grafana variable ${name} in {expr!r}"
        return values[name]

    return re.sub(r"\$\{(?P<braced>\w+)\}|\$(?P<plain>\w+)", value, expr)


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel, rows included."""
    found = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner.get("title", "?"), t["expr"]) for t in inner.get("targets", []) if t.get("expr")]
    return found
