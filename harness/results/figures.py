"""Figures in ``results/README.md`` checked against the committed files they cite.

The figures table (the first table after ``## Figures``) has three columns: what,
figure, source. The source cell names one committed JSON file and, after it, one key
path per number of the figure (all in backticks):
`results/cpu/run-a/results.json` `extra.table.one-step.overlap_efficiency`.

Key paths name what they cite; they never count positions. A path is dotted keys
(``rows.mixed.ratio``); where the file holds a list of records, a selector picks the one
record whose fields have the given values: ``rows[engines=2,mode=one-step].step_error``
(a selector's field may be dotted itself, ``runs[config.name=fully-async-retract-tensor]``;
a number or boolean is compared as JSON writes it). A list index (``rows.7``) is refused.

Reading the figure's numbers in order (plain, with thousands commas, or scientific like
``1.75e-3``), each key path accounts for one number, or for two when it resolves to a
list: then the figure states its range, ``min-max``. Every number of the figure must be
accounted for. A number followed by ``%`` is compared with 100 x the value, one followed
by ``GiB`` with the value (bytes) / 2**30, one followed by ``x`` as a plain number. Each
comparison rounds the file's value to the decimals the figure prints, so a stale or
edited figure fails and a figure printed at its precision passes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# a sign counts only where it starts the number (after a space or a bracket), so the dash of
# a range ("0.83-0.95") is not read as a minus
NUMBER = re.compile(r"(?<![\w.])([-+\u2212]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)(\s*(?:%|GiB\b))?")
SEGMENT = re.compile(r"([^.\[\]]*)(?:\[([^\]]*)\])?")
HEADING = "## Figures"


class KeyPathError(LookupError):
    """A key path that does not resolve, with what went wrong."""


@dataclass(frozen=True)
class Figure:
    what: str
    figure: str
    source: str
    keys: tuple[str, ...]


def table_rows(text: str, heading: str = HEADING) -> list[Figure]:
    """The rows of the first table after ``heading``."""
    start = text.index(heading)
    rows: list[Figure] = []
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "what":
            continue
        ticks = re.findall(r"`([^`]+)`", cells[2])
        rows.append(Figure(cells[0], cells[1], ticks[0] if ticks else "", tuple(ticks[1:])))
    return rows


def segments(key: str) -> list[tuple[str, str | None]]:
    """``a.b[x=1,y.z=2].c`` -> [("a", None), ("b", "x=1,y.z=2"), ("c", None)]: dots split
    keys except inside a selector's brackets."""
    parts, depth, cur = [], 0, ""
    for ch in key:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "." and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        m = SEGMENT.fullmatch(part)
        if m is None or (not m.group(1) and m.group(2) is None):
            raise KeyPathError(f"{part!r} is not a key or a key[field=value,...] selector")
        out.append((m.group(1), m.group(2)))
    return out


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _select(records: Any, selector: str) -> Any:
    if not isinstance(records, list):
        raise KeyPathError(f"[{selector}] selects from a list, found {type(records).__name__}")
    wanted = [tuple(p.split("=", 1)) for p in selector.split(",")]
    if any(len(w) != 2 for w in wanted):
        raise KeyPathError(f"[{selector}]: each part is field=value")
    hits = []
    for rec in records:
        try:
            if all(_as_text(lookup(rec, field)) == value for field, value in wanted):
                hits.append(rec)
        except KeyPathError:
            continue
    if len(hits) != 1:
        raise KeyPathError(f"[{selector}] matches {len(hits)} records, not exactly one")
    return hits[0]


def lookup(doc: Any, key: str) -> Any:
    """The value at a named key path (see the module's docstring)."""
    for name, selector in segments(key):
        if name:
            if name.isdigit() and isinstance(doc, list):
                raise KeyPathError(f"{name!r} is a list position; cite the record by name, e.g. [mode=one-step]")
            if not isinstance(doc, dict) or name not in doc:
                raise KeyPathError(f"no key {name!r}")
            doc = doc[name]
        if selector is not None:
            doc = _select(doc, selector)
    return doc


def _numbers(text: str) -> list[tuple[str, str]]:
    """(number, unit) pairs; unit is "", "%" or "GiB"."""
    return [
        (m.group(1).replace(",", "").replace("\u2212", "-"), (m.group(2) or "").strip()) for m in NUMBER.finditer(text)
    ]


def _matches(printed: str, unit: str, value: float) -> bool:
    v = value * 100 if unit == "%" else value / 2**30 if unit == "GiB" else value
    if "e" in printed:  # scientific: compare at the printed mantissa's precision
        mantissa = printed.split("e")[0]
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        return float(f"{v:.{digits}e}") == float(printed)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return round(v, decimals) == round(float(printed), decimals)


def check_figure(fig: Figure, root: Path) -> list[str]:
    """Problems with one row; empty when every number matches its file."""
    if not fig.source:
        return [f"{fig.what!r}: the source cell names no file"]
    path = root / fig.source
    if not path.is_file():
        return [f"{fig.what!r}: {fig.source} does not exist"]
    doc = json.loads(path.read_text())
    numbers = _numbers(fig.figure)
    problems, i = [], 0
    for key in fig.keys:
        try:
            value = lookup(doc, key)
        except KeyPathError as exc:
            problems.append(f"{fig.what!r}: {fig.source} {key!r}: {exc}")
            continue
        wanted = [min(value), max(value)] if isinstance(value, list) else [value]
        for v in wanted:
            if i >= len(numbers):
                problems.append(f"{fig.what!r}: the figure {fig.figure!r} has fewer numbers than its keys")
                return problems
            printed, unit = numbers[i]
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                problems.append(f"{fig.what!r}: {fig.source} {key} is {v!r}, not a number")
            elif not _matches(printed, unit, float(v)):
                problems.append(f"{fig.what!r}: the figure says {printed}{unit} for {key}, {fig.source} has {v}")
            i += 1
    if not problems and i < len(numbers):
        problems.append(
            f"{fig.what!r}: the figure {fig.figure!r} has numbers no key accounts for: "
            + ", ".join(n + u for n, u in numbers[i:])
        )
    return problems


__all__ = ["Figure", "KeyPathError", "check_figure", "lookup", "segments", "table_rows"]
