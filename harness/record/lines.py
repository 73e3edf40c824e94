"""The lines of a record file (``harness.record.writer``) as the merge reads them.

Every line is ``{"kind", "mono", "wall", **fields}``: ``Line`` holds the three common
fields typed and the event's own fields as JSON (``fields``), parsed once when the file is
read. Two kinds are read field by field, so they are narrowed to a type once: a Miles
``generate_call`` (``harness.record.wrappers.generate``) becomes a ``Call``, a server's
``finished`` a ``Request``. A field of the wrong type is an error naming the file, the
line, the field and its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles_async_core.errors import ConfigError

from harness.typing_aliases import JSONDict, JSONList, JSONValue

# a generate call's identity: the sample's index and the call's start on its process's clock
CallKey = tuple[int | None, float]


@dataclass(frozen=True)
class Line:
    """One line of a process file: its kind, its process's ``time.monotonic()`` and
    ``time.time()``, the event's own fields, and where it is (for errors)."""

    kind: str
    mono: float
    wall: float
    fields: JSONDict
    path: Path
    number: int  # 1-based line number in ``path``

    @classmethod
    def parse(cls, doc: JSONValue, path: Path, number: int) -> Line | None:
        """``doc`` as a line, or None when it is not an object with a string ``kind`` and
        numeric ``mono`` and ``wall``."""
        if not isinstance(doc, dict):
            return None
        kind, mono, wall = doc.get("kind"), doc.get("mono"), doc.get("wall")
        if not (isinstance(kind, str) and isinstance(mono, (int, float)) and isinstance(wall, (int, float))):
            return None
        fields = {k: v for k, v in doc.items() if k not in ("kind", "mono", "wall")}
        return cls(kind, float(mono), float(wall), fields, path, number)

    def _wrong(self, key: str, allowed: str) -> ConfigError:
        return ConfigError(
            f"record {self.path}, line {self.number}: {self.kind} field {key!r} is "
            f"{self.fields.get(key)!r}. Allowed: {allowed}, as harness.record writes it. "
            "Fix: remove the line or record the run again"
        )

    def get_int(self, key: str) -> int:
        value = self.fields.get(key)
        if isinstance(value, int):
            return value
        raise self._wrong(key, "an integer")

    def get_optional_int(self, key: str) -> int | None:
        value = self.fields.get(key)
        if value is None or isinstance(value, int):
            return value
        raise self._wrong(key, "an integer or null")

    def get_number(self, key: str) -> float:
        value = self.fields.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        raise self._wrong(key, "a number")

    def get_optional_str(self, key: str) -> str | None:
        value = self.fields.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self._wrong(key, "a string or null")

    def get_list(self, key: str) -> JSONList:
        value = self.fields.get(key)
        if isinstance(value, list):
            return value
        raise self._wrong(key, "a list")


@dataclass
class Call:
    """A Miles ``generate_call`` on the merged clock (``t0``: its start, ``t1``: its end),
    and the server whose request answered it (``server``: that server's number, None
    while unjoined)."""

    index: int | None  # Sample.index
    group_index: int | None  # Sample.group_index is int | None upstream
    start_mono: float
    t0: float
    t1: float
    added_tokens: JSONValue
    response_length: JSONValue
    status: JSONValue
    added_versions: JSONList
    weight_versions: JSONList
    tokens_digest: str | None
    server: int | None = None

    @classmethod
    def parse(cls, line: Line, offset: float) -> Call:
        start = line.get_number("start_mono")
        return cls(
            index=line.get_optional_int("index"),
            group_index=line.get_optional_int("group_index"),
            start_mono=start,
            t0=start + offset,
            t1=line.mono + offset,
            added_tokens=line.fields.get("added_tokens"),
            response_length=line.fields.get("response_length"),
            status=line.fields.get("status"),
            added_versions=line.get_list("added_versions"),
            weight_versions=line.get_list("weight_versions"),
            tokens_digest=line.get_optional_str("tokens_digest") or None,
        )

    @property
    def key(self) -> CallKey:
        return (self.index, self.start_mono)


@dataclass(frozen=True)
class Request:
    """A request a server finished (its ``submitted`` and ``finished`` lines): the server's
    number and request index, its submission and end on the merged clock, and what it
    answered with."""

    server: int
    index: int
    t_sub: float
    t: float
    response_length: JSONValue
    status: str  # lower case, as a Miles sample's status is recorded
    weight_versions: list[str]
    tokens_digest: str | None

    @classmethod
    def parse(cls, done: Line, server: int, t_sub: float, offset: float) -> Request:
        return cls(
            server=server,
            index=done.get_int("index"),
            t_sub=t_sub,
            t=done.mono + offset,
            response_length=done.fields.get("response_length"),
            status=str(done.fields.get("status")).lower(),
            weight_versions=[str(v) for v in done.get_list("weight_versions")],
            tokens_digest=done.get_optional_str("tokens_digest") or None,
        )
