"""README figures checked against the committed files they cite.

The README's "Measured here" table has three columns: what, figure, source. The source
cell names one committed JSON file and, after it, one key path per number of the figure
(all in backticks): `results/bench/sim_speed.json` `samples_per_cpu_s`. Key paths are
dotted (``rows.mixed.ratio``; a list index is a number). Reading the figure's numbers in
order (plain, with thousands commas, or scientific like ``1.75e-3``), each key path accounts for one number, or for two when it resolves to a list:
then the figure states its range, ``min-max``. A number followed by ``%`` is compared
with 100 x the value, one followed by ``GiB`` with the value (bytes) / 2**30, a number followed by ``x`` as a plain number. Each comparison
rounds the file's value to the decimals the README prints, so a stale or edited figure
fails and a figure printed at its precision passes.
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


@dataclass(frozen=True)
class Figure:
    what: str
    figure: str
    source: str
    keys: tuple[str, ...]


def table_rows(readme: str, heading: str = "## Measured here") -> list[Figure]:
    """The rows of the first table after ``heading``."""
    start = readme.index(heading)
    rows = []
    for line in readme[start:].splitlines()[1:]:
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


def lookup(doc: Any, key: str) -> Any:
    for part in key.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _numbers(text: str) -> list[tuple[str, str]]:
    """(number, unit) pairs; unit is "", "%" or "GiB"."""
    return [(m.group(1).replace(",", "").replace("\u2212", "-"), (m.group(2) or "").strip())
            for m in NUMBER.finditer(text)]


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
        except (KeyError, IndexError, ValueError, TypeError):
            problems.append(f"{fig.what!r}: {fig.source} has no key {key!r}")
            continue
        wanted = [min(value), max(value)] if isinstance(value, list) else [value]
        for v in wanted:
            if i >= len(numbers):
                problems.append(f"{fig.what!r}: the figure {fig.figure!r} has fewer numbers than its keys")
                return problems
            printed, unit = numbers[i]
            if not _matches(printed, unit, float(v)):
                problems.append(f"{fig.what!r}: README says {printed}{unit} for {key}, "
                                f"{fig.source} has {v}")
            i += 1
    return problems


__all__ = ["Figure", "check_figure", "lookup", "table_rows"]
