"""What the gate decides about its two trees before any case runs: identical trees, a
pull request that does not compile, and a refusal (no driver the cases need can run
faithfully), each read from the trees' files alone (nothing is imported).

``identical(head, base)``: the files the harness runs (every file under ``miles/`` and
the root drivers) are byte for byte the same. ``compile_errors(tree)``: each Python file
of those that does not compile, with its line. ``refusal(report, drivers, flag)``: the
lines that say why a tree can run none of ``drivers``, each missing seam once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from harness.upstream.seams import Seam, TreeReport
from harness.upstream.source import DRIVER_FILES


def run_files(tree: Path) -> list[Path]:
    """The files of ``tree`` the harness runs: everything under ``miles/`` (sorted), then
    the root drivers that exist."""
    files = sorted(p for p in (tree / "miles").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return files + [tree / d for d in DRIVER_FILES if (tree / d).is_file()]


def digest(tree: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of ``run_files(tree)``."""
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in run_files(tree)}


def identical(head: Path, base: Path) -> int | None:
    """The number of files when the two trees' run files are the same, else ``None``."""
    a = digest(head)
    return len(a) if a == digest(base) else None


@dataclass(frozen=True)
class CompileError:
    file: str  # relative to the tree
    line: int
    error: str  # e.g. "SyntaxError: '(' was never closed"

    def where(self) -> str:
        return f"{self.file}:L{self.line}"


def compile_errors(tree: Path) -> list[CompileError]:
    """Each Python file of ``run_files(tree)`` that does not compile (a SyntaxError, an
    IndentationError, a null byte), with its line."""
    out = []
    for path in run_files(tree):
        if path.suffix != ".py":
            continue
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None) or 0
            text = getattr(exc, "msg", None) or str(exc)
            out.append(CompileError(str(path.relative_to(tree)), line, f"{type(exc).__name__}: {text}"))
    return out


def new_compile_errors(head: Path, base: Path) -> list[CompileError]:
    """HEAD's compile errors in files that compile on BASE (or that BASE lacks)."""
    old = {e.file for e in compile_errors(base)}
    return [e for e in compile_errors(head) if e.file not in old]


def describe(seam: Seam, tree: Path | None = None) -> str:
    """One line for a missing seam: what was looked for and where. A seam whose whole file
    is absent from ``tree`` is said as that (an older tree)."""
    if tree is not None and not (tree / seam.file).is_file():
        return f"{seam.file} does not exist in this tree"
    return f"{seam.file}: no {seam.looks_for}"


def refusal(report: TreeReport, drivers: list[str], flag: str) -> list[str]:
    """Why ``report``'s tree can run none of ``drivers``: a first line, then each missing
    seam once with the drivers it stops, then the fix."""
    stops: dict[str, tuple[Seam, list[str]]] = {}
    for d in drivers:
        for s in report.missing_for(d):
            stops.setdefault(s.name, (s, []))[1].append(d)
    lines = [f"{flag} {report.tree}: the harness can run none of the drivers the cases need ({', '.join(drivers)}):"]
    said: dict[str, list[str]] = {}
    for s, ds in stops.values():
        said.setdefault(describe(s, report.tree), ds)
    lines += [f"  - {text} (stops {', '.join(ds)})" for text, ds in said.items()]
    lines.append(f"Fix: `miles-harness doctor --miles-src {report.tree}` shows every seam.")
    return lines


__all__ = [
    "DRIVER_FILES",
    "CompileError",
    "compile_errors",
    "describe",
    "digest",
    "identical",
    "new_compile_errors",
    "refusal",
    "run_files",
]
