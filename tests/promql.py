"""A small subset of PromQL, enough to evaluate the repository's alert rules and Grafana
panels (dashboard/monitoring/) against a real scrape where promtool is not installed:
`agg by (labels) (selector)` or a bare selector, each optionally compared with a number
(a filter, as in PromQL). Anything else is a ValueError, so a rule cannot drift into syntax
this evaluator would silently misread."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Series = list[tuple[dict[str, str], float]]
COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
    ">=": operator.ge, "<=": operator.le,
}  # fmt: skip
AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "max": max, "min": min, "count": len,  # type: ignore[dict-item]
}  # fmt: skip
_TAIL = r"\s*(?:(==|!=|>=|<=|>|<)\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?))?\s*$"
_AGG = re.compile(r"^\s*(sum|max|min|count)\s+by\s*\(([^)]*)\)\s*\((.*)\)" + _TAIL)
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][\w:]*)\s*(?:\{(.*)\})?" + _TAIL)
_MATCHER = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def samples(scrape: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a scrape, parsed by prometheus_client's own parser."""
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(scrape)
        for s in family.samples
    ]


def _matchers(text: str) -> list[tuple[str, str, str]]:
    found, at = [], 0
    while at < len(text):
        m = _MATCHER.match(text, at)
        if m is None:
            raise ValueError(f"cannot read label matchers {text!r}")
        value = m.group(3).encode().decode("unicode_escape")
        found.append((m.group(1), m.group(2), value))
        at = m.end()
    return found


def _match(labels: dict[str, str], op: str, name: str, value: str) -> bool:
    have = labels.get(name, "")
    return {
        "=": have == value,
        "!=": have != value,
        "=~": re.fullmatch(value, have) is not None,
        "!~": re.fullmatch(value, have) is None,
    }[op]


def _filter(series: Series, op: str | None, number: str | None) -> Series:
    if op is None or number is None:
        return series
    return [(labels, v) for labels, v in series if COMPARE[op](v, float(number))]


def evaluate(expr: str, scraped: list[tuple[str, dict[str, str], float]]) -> Series:
    """The instant vector `expr` gives on `scraped`."""
    agg = _AGG.match(expr)
    if agg is not None:
        fn, by, inner, op, number = agg.groups()
        keys = [k.strip() for k in by.split(",") if k.strip()]
        groups: dict[tuple[str, ...], list[float]] = {}
        for labels, v in evaluate(inner, scraped):
            groups.setdefault(tuple(labels.get(k, "") for k in keys), []).append(v)
        out = [(dict(zip(keys, g, strict=True)), AGGREGATE[fn](vs)) for g, vs in groups.items()]
        return _filter(out, op, number)
    sel = _SELECTOR.match(expr)
    if sel is None:
        raise ValueError(f"not in the PromQL subset tests/promql.py reads: {expr!r}")
    name, matchers, op, number = sel.groups()
    wanted = _matchers(matchers or "")
    out = [
        (labels, v)
        for n, labels, v in scraped
        if n == name and all(_match(labels, o, k, val) for k, o, val in wanted)
    ]
    return _filter(out, op, number)


def exprs_of(dashboard: dict[str, Any]) -> list[str]:
    """Every panel target's expression of a Grafana dashboard (JSON model)."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
