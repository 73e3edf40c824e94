"""Chrome-trace / Perfetto timelines of phase intervals (open in ui.perfetto.dev or
chrome://tracing). One process row per mode, one thread row per side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIDE_TID = {"rollout": 1, "train": 2}


def chrome_trace(modes: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """``modes``: {mode: [[side, phase, t0_s, t1_s], ...]} -> a Trace Event Format document."""
    events: list[dict[str, Any]] = []
    for pid, (mode, phases) in enumerate(modes.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": mode}})
        for side, tid in SIDE_TID.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": side}})
        for side, phase, t0, t1 in phases:
            events.append(
                {
                    "name": phase,
                    "cat": side,
                    "ph": "X",
                    "pid": pid,
                    "tid": SIDE_TID.get(side, 3),
                    "ts": round(t0 * 1e6, 3),
                    "dur": round(max(0.0, t1 - t0) * 1e6, 3),
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(modes: dict[str, list[list[Any]]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(modes)))
    return path
