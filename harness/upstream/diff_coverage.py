"""Diff coverage for the gate: which of a pull request's changed lines ran in HEAD's cases.

In HEAD's process (``harness.upstream.gate_run --cover FILE``) a ``Probe`` measures the
changed files only, with coverage.py's tracer, one dynamic context per case (and one for
the import before the first case), and hands back each executed line with the cases it
ran in. The gate then reads that per hunk (``report``): a hunk ran in N cases (any of its
statements ran in a case), ran at import (module-level code, run before any case), or
never ran. A hunk of the asynchronous code (``diff_lines.ASYNC_PATHS``) that never ran is
work the gate did not check: ``CoverageReport.unchecked``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.upstream.diff_lines import hunks, is_async, statements

IMPORT = -1  # the case index of what ran while the tree was imported, before any case
_IMPORT_CONTEXT = "(import)"


class Probe:
    """coverage.py on ``files`` (relative to ``tree``) of one worker process."""

    def __init__(self, tree: Path, files: list[str]) -> None:
        import coverage

        self.tree = tree
        self.cov = coverage.Coverage(
            data_file=None, include=[str(tree / f) for f in files], branch=False, config_file=False
        )
        self.cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured"])

    def start(self) -> None:
        self.cov.start()
        self.cov.switch_context(_IMPORT_CONTEXT)

    def case(self, name: str) -> None:
        """What runs from now on runs in case ``name``."""
        self.cov.switch_context(name)

    def finish(self, names: list[str]) -> dict[str, dict[str, list[list[int]]]]:
        """``{file: {line: [[first, last], ...]}}`` for every executed line of the
        measured files: the case indices it ran in, as inclusive ranges (a line most
        cases run is one range), ``IMPORT`` for the import before the first case."""
        self.cov.stop()
        data = self.cov.get_data()
        index = {n: i for i, n in enumerate(names)}
        root = str(self.tree) + "/"
        out: dict[str, dict[str, list[list[int]]]] = {}
        for path in sorted(data.measured_files()):
            if not path.startswith(root):
                continue
            lines = data.contexts_by_lineno(path)
            out[path[len(root) :]] = {
                str(n): _ranges({index.get(c, IMPORT) for c in ctx} or {IMPORT}) for n, ctx in sorted(lines.items())
            }
        return out


def _ranges(ints: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for n in sorted(ints):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def _expand(ranges: list[list[int]]) -> set[int]:
    return {n for a, b in ranges for n in range(a, b + 1)}


@dataclass
class HunkCoverage:
    file: str
    start: int  # HEAD's lines, inclusive
    end: int
    statements: int  # the statements the hunk changes
    cases: int  # the cases in which any of them ran
    at_import: bool  # one of them ran while the tree was imported (module-level code)
    missed: list[int] = field(default_factory=list)  # the statements' first lines that never ran

    @property
    def ran(self) -> bool:
        return self.cases > 0 or self.at_import

    @property
    def unchecked(self) -> bool:
        return self.statements > 0 and not self.ran and is_async(self.file)

    def where(self) -> str:
        return f"L{self.start}" if self.start == self.end else f"L{self.start}-L{self.end}"

    def text(self) -> str:
        if not self.ran:
            return f"{self.where()} never ran"
        how = f"ran in {self.cases} case{'' if self.cases == 1 else 's'}" if self.cases else "ran at import only"
        if self.missed:
            shown = ", ".join(f"L{n}" for n in self.missed[:4]) + (" ..." if len(self.missed) > 4 else "")
            how += f" ({len(self.missed)} of {self.statements} statements never ran: {shown})"
        return f"{self.where()} {how}"


@dataclass
class CoverageReport:
    cases: int  # HEAD's cases measured
    files: list[str]  # HEAD's changed Python files
    hunks: list[HunkCoverage]
    inert: int = 0  # changed hunks without a statement (comments, blank lines, docstrings)

    @property
    def unchecked(self) -> list[HunkCoverage]:
        return [h for h in self.hunks if h.unchecked]

    def lines(self) -> list[str]:
        """The report for the first screen: a line per changed file, with each hunk."""
        if not self.files:
            return ["diff coverage: no Python file under miles/ or the drivers changed: no changed line to run"]
        if not self.hunks:
            return [
                f"diff coverage: {len(self.files)} changed Python file(s), no changed statement "
                f"(comments, blank lines, docstrings, removed lines only)"
            ]
        out = [f"diff coverage: HEAD's changed statements in its {self.cases} cases"]
        for f in self.files:
            mine = [h for h in self.hunks if h.file == f and h.statements]
            if not mine:
                continue
            tag = "" if is_async(f) else " (not async code: the harness stands in for it)"
            out.append(f"  {f}{tag}: " + "; ".join(h.text() for h in mine))
        n = len(self.unchecked)
        files = len({h.file for h in self.unchecked})
        out.append(
            f"  UNCHECKED: {n} changed hunk(s) of the async code in {files} file(s) never ran in any case"
            if n
            else "  every changed hunk of the async code ran"
        )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "files": self.files,
            "hunks": [{**asdict(h), "ran": h.ran, "unchecked": h.unchecked} for h in self.hunks],
            "inert_hunks": self.inert,
            "unchecked": len(self.unchecked),
        }


def report(
    head: Path, base: Path, files: list[str], measured: dict[str, dict[str, list[list[int]]]], cases: int
) -> CoverageReport:
    """Each changed hunk of ``files``, cut per function (``_per_function``), with where
    its statements ran (``measured``: a ``Probe``'s ``finish``)."""
    out: list[HunkCoverage] = []
    inert = 0
    for rel in files:
        text = (head / rel).read_text(errors="replace")
        old = (base / rel).read_text(errors="replace") if (base / rel).is_file() else ""
        stm = statements(text)
        ran_in: dict[int, set[int]] = {}
        for line, idx in measured.get(rel, {}).items():
            key = stm.ran.get(int(line))
            if key is not None:
                ran_in.setdefault(key, set()).update(_expand(idx))
        for start, end in hunks(text, old):
            own = [n for n in range(start, end + 1) if n in stm.changed]
            if not own:
                inert += 1
            for part in _per_function(own, stm.scope):
                out.append(_hunk(rel, part, [stm.changed[n] for n in part], ran_in))
    return CoverageReport(cases=cases, files=files, hunks=out, inert=inert)


def _per_function(lines: list[int], scope: dict[int, int]) -> list[list[int]]:
    """``lines`` cut where the function they are in changes (``Statements.scope``)."""
    parts: list[list[int]] = []
    for n in lines:
        if parts and scope.get(n, 0) == scope.get(parts[-1][-1], 0):
            parts[-1].append(n)
        else:
            parts.append([n])
    return parts


def _hunk(rel: str, lines: list[int], stmts: list[int], ran_in: dict[int, set[int]]) -> HunkCoverage:
    """One hunk (said from its first statement line to its last) with where it ran."""
    keys = sorted(set(stmts))
    seen: set[int] = set().union(*(ran_in.get(k, set()) for k in keys))
    return HunkCoverage(
        rel,
        lines[0],
        lines[-1],
        statements=len(keys),
        cases=len(seen - {IMPORT}),
        at_import=IMPORT in seen,
        missed=[k for k in keys if k not in ran_in],
    )


__all__ = ["IMPORT", "CoverageReport", "HunkCoverage", "Probe", "report"]
