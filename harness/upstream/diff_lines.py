"""The lines a pull request changes, and which statement each belongs to, read from the
two trees' files (nothing is imported).

``changed_files(head, base)``: the Python files the harness runs (``gate_preflight.run_files``:
``miles/`` and the root drivers) whose text differs from BASE's, or that BASE lacks.
``hunks(head_text, base_text)``: HEAD's changed line ranges (``difflib``, lines added or
replaced; a hunk that only removes lines has none of HEAD's lines to run).
``statements(source)``: each line's statement, so that a changed line and an executed
line compare as statements: the coverage tracer reports a multi-line statement on
whichever of its lines holds the instruction, and a changed argument sits on another.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

from harness.upstream.gate_preflight import run_files

# The asynchronous code a Miles pull request is gated on: the drivers and the packages they
# run (the paths docs/examples/miles-gate.yml watches). A change elsewhere (the Megatron
# backend, the dashboard) is reported, but that it never ran is no surprise: the harness
# stands in for those parts.
ASYNC_PATHS = ("miles/rollout/", "miles/ray/", "miles/utils/", "train.py", "train_async.py")


def is_async(rel: str) -> bool:
    return rel.startswith(ASYNC_PATHS)


def changed_files(head: Path, base: Path) -> list[str]:
    """HEAD's Python run files (relative) whose text differs from BASE's or that BASE lacks."""
    out = []
    for path in run_files(head):
        if path.suffix != ".py":
            continue
        rel = str(path.relative_to(head))
        other = base / rel
        if not other.is_file() or other.read_bytes() != path.read_bytes():
            out.append(rel)
    return out


def hunks(head_text: str, base_text: str) -> list[tuple[int, int]]:
    """HEAD's changed line ranges, 1-based and inclusive, in order."""
    a, b = base_text.splitlines(), head_text.splitlines()
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(j1 + 1, j2) for tag, _i1, _i2, j1, j2 in ops if tag in ("replace", "insert")]


@dataclass(frozen=True)
class Statements:
    """``changed[line]``: the statement a changed line belongs to, as the line whose
    execution shows that it ran; ``ran[line]``: the same for a line the tracer reported.
    A function's header (decorators, ``def`` and its signature) runs when the function is
    defined, at import: a changed header is run when the function's body is, and the
    header's own line events say nothing (they are left out of ``ran``). A docstring runs
    no code; a blank or comment line belongs to no statement. ``scope[line]``: the
    innermost function a line is in (its ``def`` line, decorators included), 0 at module
    or class level: a hunk is judged per function, so that a new function that never ran
    is not hidden by a changed line beside it that did."""

    changed: dict[int, int]
    ran: dict[int, int]
    scope: dict[int, int]


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _body_start(node: ast.AST) -> int | None:
    """The first statement of a compound statement's own block (None for a simple one)."""
    body = getattr(node, "body", None)
    if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
        return None
    return body[0].lineno


def statements(source: str) -> Statements:
    """The statement map of ``source`` (empty when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return Statements({}, {}, {})
    changed: dict[int, int] = {}
    ran: dict[int, int] = {}
    scope: dict[int, int] = {}
    # ast.walk goes breadth first: an inner statement comes after the one around it and
    # overwrites the lines they share
    for node in ast.walk(tree):
        if not isinstance(node, (ast.stmt, ast.excepthandler)):
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        start = _body_start(node)
        last = (start - 1) if start is not None and start > first else (node.end_lineno or node.lineno)
        own = range(first, last + 1)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [s for s in node.body if not _is_docstring(s)]
            key = body[0].lineno if body else node.lineno
            for line in range(first, (node.end_lineno or node.lineno) + 1):
                scope[line] = node.lineno
            for line in own:
                changed[line] = key
                ran.pop(line, None)
            continue
        if _is_docstring(node):
            for line in own:
                changed.pop(line, None)
                ran.pop(line, None)
            continue
        # `try:` runs nothing of its own: it has run when its block has
        key = start if isinstance(node, (ast.Try, ast.TryStar)) and start is not None else node.lineno
        for line in own:
            changed[line] = key
            ran[line] = key
    return Statements(changed, ran, scope)


__all__ = ["ASYNC_PATHS", "Statements", "changed_files", "hunks", "is_async", "statements"]
