"""Trace recording: an ``EventSink`` that keeps every event with its time and a
sequence number, and JSONL export/import. An event may carry ``_t`` (seconds on the
recorder's clock) when its producer measured the time itself, e.g. another process.

A trace line is ``{"seq": i, "t": seconds, "kind": ..., **fields}``. With
``strict=True`` the recorder checks each event against ``events.EVENT_FIELDS`` and
fails loudly on an unknown kind or a missing field, so checkers can rely on the schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from miles_async_core.events import EVENT_FIELDS


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


def read_jsonl(path: str | Path) -> list[Event]:
    out = []
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        seq, t, kind = d.pop("seq"), d.pop("t"), d.pop("kind")
        out.append(Event(seq, t, kind, d))
    return out
