"""Upstream's own output, kept per case instead of on the terminal.

Upstream logs every failed group with its traceback and the harness injects such faults
on purpose, so a run of the differential or the gate would otherwise print hundreds of
lines of upstream's log around a handful of verdicts. ``captured()`` collects, for the
code run inside it: every Python log record (the root logger's handlers are replaced by
one writing to the capture; a logger with its own stream handler is pointed at the
capture), and whatever is printed to ``sys.stdout`` / ``sys.stderr`` (``print``,
``warnings``). Log levels are left as they are, so the capture holds exactly what the
terminal would have shown. The commands print a capture for a failing case (and every
case with ``-v``) and write all of them to a log file (``CaseLogFile``).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

FORMAT = "%(levelname)s:%(name)s:%(message)s"


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """Capture logging and printed output into the yielded buffer until the block ends."""
    buf = io.StringIO()
    root = logging.getLogger()
    saved_root = root.handlers[:]
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.handlers = [handler]
    swapped: list[tuple[logging.StreamHandler, TextIO]] = []
    for lg in list(logging.Logger.manager.loggerDict.values()):
        for h in getattr(lg, "handlers", ()):
            # a handler on a closed stream (a finished capture's) cannot be flushed, and has no reader
            if type(h) is logging.StreamHandler and h is not handler and not getattr(h.stream, "closed", False):
                swapped.append((h, h.stream))
                h.setStream(buf)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield buf
    finally:
        root.handlers = saved_root
        for h, stream in swapped:
            h.setStream(stream)


def tail(text: str, lines: int = 40) -> str:
    """The last ``lines`` lines of ``text``, saying how many were left out."""
    rows = text.rstrip("\n").splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    return "\n".join([f"... {len(rows) - lines} earlier lines in the log file", *rows[-lines:]])


def indent(text: str, prefix: str = "    | ") -> str:
    return "\n".join(prefix + row for row in text.rstrip("\n").splitlines())


class CaseLogFile:
    """One log file for a command: each case's captured output under a header line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def add(self, case: str, text: str, verdict: str = "") -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"===== {case}" + (f": {verdict}" if verdict else "") + "\n")
            f.write(text if text.endswith("\n") or not text else text + "\n")


__all__ = ["FORMAT", "CaseLogFile", "captured", "indent", "tail"]
