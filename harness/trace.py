"""Trace recording: an ``EventSink`` that keeps every event with its time and a
sequence number, and JSONL export/import. An event may carry ``_t`` (seconds on the
recorder's clock) when its producer measured the time itself, e.g. another process.

A trace line is ``{"seq": i, "t": seconds, "kind": ..., **fields}``. With
``strict=True`` the recorder checks each event against ``events.EVENT_FIELDS`` and
fails loudly on an unknown kind or a missing field, so checkers can rely on the schema.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from miles_async_core.errors import ConfigError
from miles_async_core.events import EVENT_FIELDS


def tokens_digest(tokens: Iterable[int]) -> str:
    """A short digest of a request's token ids (prompt then output), the same on every
    side that saw them: a server's ``finished`` event and a Miles sample's ``tokens``
    after its ``/generate`` call carry it, so the merge joins the two exactly."""
    return hashlib.blake2b(",".join(str(int(t)) for t in tokens).encode(), digest_size=8).hexdigest()


@dataclass(slots=True)
class Event:
    seq: int
    t: float
    kind: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "t": round(self.t, 9), "kind": self.kind, **self.fields}


class TraceRecorder:
    enabled = True

    def __init__(self, clock: Callable[[], float], *, strict: bool = False) -> None:
        self.clock = clock
        self.strict = strict
        self.events: list[Event] = []

    def emit(self, kind: str, /, **fields: Any) -> None:
        if self.strict:
            required = EVENT_FIELDS.get(kind)
            if required is None:
                raise ValueError(f"unknown event kind {kind!r}")
            missing = [f for f in required if f not in fields]
            if missing:
                raise ValueError(f"event {kind!r} lacks fields {missing}")
        # A producer in another process may stamp the event itself (same monotonic clock).
        t = fields.pop("_t") if "_t" in fields else self.clock()
        self.events.append(Event(len(self.events), t, kind, fields))

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def write_jsonl(self, path: str | Path) -> None:
        write_jsonl(self.events, path)


def write_jsonl(events: Iterable[Event], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for e in events:
            f.write(json.dumps(e.to_json(), sort_keys=True, separators=(",", ":")) + "\n")


def config_path(trace_path: str | Path) -> Path:
    """Where ``miles-harness simulate`` stores the config a trace was recorded under:
    ``trace.jsonl`` -> ``trace.config.json``."""
    p = Path(trace_path)
    return p.with_name((p.name[: -len(p.suffix)] if p.suffix else p.name) + ".config.json")


def read_jsonl(path: str | Path) -> list[Event]:
    """A trace written by ``write_jsonl``, checked against the event schema
    (``events.EVENT_FIELDS``): a line that is not one is a ``ConfigError`` naming the
    file, the line, what is wrong and the fix."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"trace {path}: cannot read it ({exc.strerror or exc}). Fix: pass the JSONL trace "
            "`miles-harness simulate --trace PATH` wrote"
        ) from None
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"trace {path}, line {n}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{where}: not JSON ({exc.msg}): {line[:80]!r}. Allowed: one JSON object per line, "
                "as `miles-harness simulate` writes. Fix: pass that file, or repair the line"
            ) from None
        if not isinstance(d, dict) or not {"seq", "t", "kind"} <= set(d):
            raise ConfigError(
                f"{where}: {line[:80]!r} lacks seq/t/kind. Allowed: "
                '{"seq": int, "t": seconds, "kind": ..., **fields}. Fix: pass a trace simulate wrote'
            )
        seq, t, kind = d.pop("seq"), d.pop("t"), d.pop("kind")
        if kind not in EVENT_FIELDS:
            raise ConfigError(
                f"{where}: unknown event kind {kind!r}. Allowed: {', '.join(sorted(EVENT_FIELDS))}. "
                "Fix: remove the line or correct the kind"
            )
        missing = [f for f in EVENT_FIELDS[kind] if f not in d]
        if missing:
            raise ConfigError(
                f"{where}: event {kind!r} lacks fields {missing} (a {kind!r} event carries "
                f"{list(EVENT_FIELDS[kind])}). Fix: add them or remove the line"
            )
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not isinstance(seq, int):
            raise ConfigError(
                f"{where}: seq {seq!r} / t {t!r}; allowed: an integer seq and a number of seconds. "
                "Fix: correct the line"
            )
        out.append(Event(seq, float(t), kind, d))
    return out
