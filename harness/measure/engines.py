"""Per-engine figures of a run with several engines (the ``ray`` layout), from its trace:
the per-engine rows under ``miles-harness run``'s table.

For engine ``k`` over the measurement window: ``requests`` (its ``finished`` events),
``tokens`` (one per sample of each of its ``decode_step`` events), ``decode_busy_s`` (its
decode steps' ``[t - dur_s, t]`` merged), ``busy_share`` (that over the window),
``tokens_per_s`` (tokens over the window) and ``loads`` (its ``engine_loaded`` events).
"""

from __future__ import annotations

from typing import Any

from miles_async_core import events as ev
from harness.measure.overlap import merge, total


def per_engine_rows(events: list[Any], window: tuple[float, float]) -> list[dict[str, Any]]:
    keys = sorted({e.fields.get("engine") for e in events if e.kind == ev.DECODE_STEP} - {None})
    wall = max(1e-12, window[1] - window[0])
    rows = []
    for k in keys:
        steps = [e for e in events if e.kind == ev.DECODE_STEP and e.fields.get("engine") == k]
        busy = total(merge([(e.t - e["dur_s"], e.t) for e in steps]), window)
        tokens = sum(len(e["indices"]) for e in steps if window[0] <= e.t <= window[1])
        rows.append({"engine": k, "requests": sum(1 for e in events if e.kind == ev.FINISHED
                                                  and e.fields.get("engine") == k),
                     "tokens": tokens, "decode_busy_s": busy, "busy_share": busy / wall,
                     "tokens_per_s": tokens / wall,
                     "loads": sum(1 for e in events if e.kind == ev.ENGINE_LOADED and e["engine"] == k),
                     "died": any(e.kind == ev.FAULT and e.fields.get("what") == "engine_died"
                                 and e.fields.get("engine") == k for e in events)})
    return rows


def format_engine_rows(rows_by_mode: dict[str, list[dict[str, Any]]]) -> str:
    header = ["mode", "engine", "requests", "tokens", "tokens/s", "decode busy s", "busy share", "loads", "died"]
    body = [[mode, str(r["engine"]), str(r["requests"]), str(r["tokens"]), f"{r['tokens_per_s']:.1f}",
             f"{r['decode_busy_s']:.2f}", f"{r['busy_share']:.1%}", str(r["loads"]), "yes" if r["died"] else "-"]
            for mode, rows in rows_by_mode.items() for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
