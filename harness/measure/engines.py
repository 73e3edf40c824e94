"""Per-engine figures of a run with several engines (the ``ray`` layout), from its trace:
the per-engine rows under ``miles-harness run``'s table.

For engine ``k`` over the measurement window: ``requests`` (its ``finished`` events),
``tokens`` (one per sample of each of its ``decode_step`` events), ``decode_busy_s`` (its
decode steps' ``[t - dur_s, t]`` merged), ``generating_busy_s`` (its own ``generating``
phases: from a request to work on until it has none, steps and the time between them; the
run's ``rollout_busy_s`` is the union over the engines, so with engines that are busy at
different times the union exceeds each one's), ``busy_share`` (decode busy over the window),
``tokens_per_s`` (tokens over the window) and ``loads`` (its ``engine_loaded`` events).

Its decode steps inside the window, split by what the trainer did meanwhile (a step
counts as under training when at least half of ``[t - dur_s, t]`` overlaps a ``training``
phase): ``decode_steps``, ``steps_training``, and the mean step time of each part in
milliseconds, ``step_ms``, ``step_ms_training`` and ``step_ms_not_training`` (None where
there was no such step), and the standard deviation of all its step times, ``step_ms_sd``
(None below two steps): how much the engine's own speed wanders from step to step. On hardware the engines and the trainer share, the ratio of these
to the same engine's sync-mode ``step_ms`` is the contention as the engine itself saw it,
step by step (``harness.advise.validate`` prints it next to the simulator's factors).
And split by whether the step admitted requests (an ``admitted`` event of the engine inside
``[t - dur_s, t]``: the step ran a prefill batch before its decode): ``steps_admitting``,
``step_ms_admitting`` and ``step_ms_decode_only``; their difference in a sync run is what
one prefill batch costs beyond its tokens (``harness.advise.costs`` fits ``prefill_base_s``
from it).
"""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from miles_async_core import events as ev
from harness.measure.overlap import intervals, merge, total, total_sorted


def per_engine_rows(events: list[Any], window: tuple[float, float]) -> list[dict[str, Any]]:
    by_engine: dict[Any, list[Any]] = {}  # each engine's events, in trace order: one pass over the trace
    for e in events:
        k = e.fields.get("engine")
        if k is not None:
            by_engine.setdefault(k, []).append(e)
    keys = sorted(k for k, evs in by_engine.items() if any(e.kind == ev.DECODE_STEP for e in evs))
    wall = max(1e-12, window[1] - window[0])
    training = intervals(events, "train", "training", window[1])  # merged: sorted, disjoint
    training_ends = [b for _, b in training]
    rows = []
    for k in keys:
        own = by_engine[k]
        steps = [e for e in own if e.kind == ev.DECODE_STEP]
        busy = total(merge([(e.t - e["dur_s"], e.t) for e in steps]), window)
        generating = total(intervals(own, "rollout", "generating", window[1]), window)
        inside = [e for e in steps if window[0] <= e.t <= window[1]]
        tokens = sum(len(e["indices"]) for e in inside)
        admitted = sorted(e.t for e in own if e.kind == ev.ADMITTED)
        under: list[float] = []
        rest: list[float] = []
        admitting: list[float] = []
        decode_only: list[float] = []
        for e in inside:
            t0 = e.t - e["dur_s"]
            (under if 2 * total_sorted(training, training_ends, (t0, e.t)) >= e["dur_s"] > 0 else rest).append(e)
            (admitting if _any_in(admitted, t0, e.t) else decode_only).append(e)
        rows.append(
            {
                "engine": k,
                "requests": sum(1 for e in own if e.kind == ev.FINISHED),
                "decode_steps": len(inside),
                "steps_training": len(under),
                "step_ms": _mean_ms(inside),
                "step_ms_sd": _sd_ms(inside),
                "step_ms_training": _mean_ms(under),
                "step_ms_not_training": _mean_ms(rest),
                "steps_admitting": len(admitting),
                "step_ms_admitting": _mean_ms(admitting),
                "step_ms_decode_only": _mean_ms(decode_only),
                "tokens": tokens,
                "decode_busy_s": busy,
                "generating_busy_s": generating,
                "busy_share": busy / wall,
                "tokens_per_s": tokens / wall,
                "loads": sum(1 for e in own if e.kind == ev.ENGINE_LOADED),
                "died": any(e.kind == ev.FAULT and e.fields.get("what") == "engine_died" for e in own),
            }
        )
    return rows


def _any_in(sorted_times: list[float], t0: float, t1: float) -> bool:
    i = bisect.bisect_left(sorted_times, t0)
    return i < len(sorted_times) and sorted_times[i] <= t1


def _sd_ms(steps: list[Any]) -> float | None:
    return 1e3 * statistics.stdev(e["dur_s"] for e in steps) if len(steps) > 1 else None


def _mean_ms(steps: list[Any]) -> float | None:
    return 1e3 * sum(e["dur_s"] for e in steps) / len(steps) if steps else None


def format_engine_rows(rows_by_mode: dict[str, list[dict[str, Any]]]) -> str:
    header = [
        "mode",
        "engine",
        "requests",
        "tokens",
        "tokens/s",
        "decode busy s",
        "busy share",
        "step ms: all / training / not",
        "loads",
        "died",
    ]
    body = [
        [
            mode,
            str(r["engine"]),
            str(r["requests"]),
            str(r["tokens"]),
            f"{r['tokens_per_s']:.1f}",
            f"{r['decode_busy_s']:.2f}",
            f"{r['busy_share']:.1%}",
            " / ".join(
                "-" if r.get(k) is None else f"{r[k]:.1f}"
                for k in ("step_ms", "step_ms_training", "step_ms_not_training")
            ),
            str(r["loads"]),
            "yes" if r["died"] else "-",
        ]
        for mode, rows in rows_by_mode.items()
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
