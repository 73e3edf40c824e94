"""One JSONL event file per process, in the directory ``MILES_HARNESS_RECORD_DIR``.

The first line of a file is the process's identity (``kind: "process"``: pid, role, host
name, argv); every line after it is one event ``{"kind", "mono", "wall", **fields}``:
``mono`` is ``time.monotonic()`` (orders the events of this process), ``wall`` is
``time.time()`` (aligns processes in the merge). Each line is handed to the kernel on its
own, encoded whole and written with one ``os.write`` on a descriptor opened with
``O_APPEND`` (one system call per event, no buffer in this process), so a process that is
killed loses at most the line it was writing; the merge reads a truncated last line as
the end of that process's record.

A recorder that fails to write switches itself off and says so once on stderr: it never
stops the run it watches.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.trace import Event

DIR_ENV = "MILES_HARNESS_RECORD_DIR"
ROLE_ENV = "MILES_HARNESS_RECORD_ROLE"
PROCESS = "process"  # the identity line


class ProcessRecord:
    """The event file of this process (opened on the first event)."""

    def __init__(self, directory: str | os.PathLike[str], role: str) -> None:
        self.directory = Path(directory)
        self.role = role
        self.pid = os.getpid()
        self.path = self.directory / f"{role}-{socket.gethostname()}-{self.pid}.jsonl"
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.broken = False
        self.lines = 0
        self.bytes = 0

    def _open(self, flags: int = os.O_APPEND) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | flags, 0o644)

    def _write(self, doc: Mapping[str, object]) -> None:
        data = (json.dumps(doc, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        assert self.fd is not None, "_open() first"
        done = os.write(self.fd, data)
        while done < len(data):  # a regular file takes it whole; a short write only on a full disk
            done += os.write(self.fd, data[done:])
        self.lines += 1
        self.bytes += len(data)

    def _identity(self, mono: float, wall: float, argv: list[str]) -> None:
        self._write(
            {
                "kind": PROCESS,
                "pid": self.pid,
                "role": self.role,
                "host": socket.gethostname(),
                "argv": argv,
                "mono": mono,
                "wall": wall,
            }
        )

    def emit(self, kind: str, /, **fields: object) -> None:
        if self.broken:
            return
        at = fields.pop("_at", None)  # (mono, wall) measured earlier by the caller
        mono, wall = at if isinstance(at, tuple) else (time.monotonic(), time.time())
        doc = {"kind": kind, "mono": mono, "wall": wall, **fields}
        try:
            with self.lock:
                if self.fd is None:
                    self._open()
                    self._identity(time.monotonic(), time.time(), list(sys.argv[:8]))
                self._write(doc)
        except (OSError, TypeError, ValueError) as exc:
            self.broken = True
            print(f"miles-harness record: recording stopped, cannot write {self.path}: {exc}", file=sys.stderr)

    def close(self) -> None:
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


_RECORDS: dict[tuple[str, int], ProcessRecord] = {}
_RECORDS_LOCK = threading.Lock()


def record(role: str | None = None) -> ProcessRecord | None:
    """This process's record for ``role`` (default ``$MILES_HARNESS_RECORD_ROLE`` or
    ``rollout``), or None when ``MILES_HARNESS_RECORD_DIR`` is unset (recording off).
    A forked child gets a file of its own (the key holds the pid)."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    role = role or os.environ.get(ROLE_ENV) or "rollout"
    key = (role, os.getpid())
    with _RECORDS_LOCK:
        rec = _RECORDS.get(key)
        if rec is None or rec.directory != Path(directory):
            rec = _RECORDS[key] = ProcessRecord(directory, role)
        return rec


def emit(kind: str, /, **fields: object) -> None:
    rec = record()
    if rec is not None:
        rec.emit(kind, **fields)


def close_all() -> None:
    with _RECORDS_LOCK:
        for rec in _RECORDS.values():
            rec.close()
        _RECORDS.clear()


def write_foreign_trace(
    directory: str | os.PathLike[str], role: str, events: list[Event], *, mono_to_wall: float
) -> Path:
    """Write a trace another component recorded on this machine's monotonic clock (the
    CPU server's ``TraceRecorder`` events: ``t`` = ``time.monotonic()``) as a process file
    of ``directory``; ``mono_to_wall`` is ``time.time() - time.monotonic()`` measured in
    the process that kept that clock."""
    rec = ProcessRecord(directory, role)
    rec._open(os.O_TRUNC)
    try:
        mono = time.monotonic()
        rec._identity(mono, mono + mono_to_wall, [])
        for e in events:
            rec._write({"kind": e.kind, "mono": e.t, "wall": e.t + mono_to_wall, **e.fields})
    finally:
        rec.close()
    return rec.path
