"""Keep CPython 3.11's re-entrant ``ast.parse`` bug away from the test process.

The bug (seen in CI on 3.11.7, reproduced in ``suites/harness/test_py311_guard.py``):
``PyAST_mod2obj`` keeps its recursion counter in interpreter-wide state. When a garbage
collection runs inside an ``ast.parse`` (pytest's assertion rewriting, hypothesis'
function digest, ``inspect``), a finalizer may log "Task exception was never retrieved";
formatting that traceback on 3.11 calls ``ast.parse`` again (for the ``^^^^`` caret
anchors), which resets the shared counter, and the *outer* parse fails with
``SystemError: AST constructor recursion depth mismatch``, in a test that has nothing
to do with the leaked task.

The core retrieves every task it starts (``rollout.discard_tasks``), so our code no
longer leaks such tasks; this guard covers whatever still does (a seeded mutant, a
user's engine). It renders the traceback of every ``asyncio`` log record as plain
``File/line/in`` lines, without caret anchors and so without ``ast``, before any
handler formats it. Nothing is hidden: the record keeps its message, frames, source
lines and the exception chain.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import TracebackType

_CHAIN = (
    ("__cause__", "The above exception was the direct cause of the following exception:"),
    ("__context__", "During handling of the above exception, another exception occurred:"),
)


def plain_exc_text(exc: BaseException) -> str:
    """The usual traceback text, minus caret lines; never calls ``ast``."""
    parts: list[str] = []
    seen: set[int] = set()

    def render(e: BaseException) -> None:
        seen.add(id(e))
        for attr, banner in _CHAIN:
            linked = getattr(e, attr)
            if linked is not None and id(linked) not in seen and not (attr == "__context__" and e.__suppress_context__):
                render(linked)
                parts.append(f"\n{banner}\n\n")
                break
        parts.append(_frames(e.__traceback__))
        parts.extend(traceback.format_exception_only(type(e), e))

    render(exc)
    return "".join(parts).rstrip("\n")


def _frames(tb: TracebackType | None) -> str:
    if tb is None:
        return ""
    lines = ["Traceback (most recent call last):\n"]
    for frame in traceback.extract_tb(tb):
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
        if frame.line:
            lines.append(f"    {frame.line.strip()}\n")
    return "".join(lines)


class PlainTracebacks(logging.Filter):
    """Pre-renders ``record.exc_text`` so no formatter calls ``traceback`` with carets."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = plain_exc_text(record.exc_info[1])
        return True


def install(logger_name: str = "asyncio") -> bool:
    """Install once on CPython 3.11 (3.12 keeps the counter per call). True if installed."""
    if sys.version_info[:2] != (3, 11):
        return False
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, PlainTracebacks) for f in logger.filters):
        logger.addFilter(PlainTracebacks())
    return True
