"""Overlap, idle time and speedup, measured from a trace's phase intervals.

Phases: side ``rollout`` phase ``generating`` (the engine's batch is busy); side
``train`` phases ``training``, ``weight_sync`` and ``waiting`` (for a generate/drain).

* ``both_busy_fraction``: share of the window where the engine computes while the
  trainer trains. Where the engine records its decode steps (``decode_step``: the real
  engines, each step's interval ``[t - dur_s, t]`` stamped by the engine itself), the
  engine side is those intervals (``decode_busy_s``), so an engine that kept decoding
  after a pause counts, whatever a wrapper says about its phases; the simulated engine
  records no decode steps and its ``generating`` phase stands in.
* ``rollout_idle_ratio``: share of the window the engine had nothing running (verl's
  ``idle_ratio`` for the rollout side); ``train_idle_ratio`` likewise for the trainer
  (not training and not syncing weights); ``wait_time_ratio``: share spent waiting for
  rollout data (Miles' ``perf/wait_time_ratio``).
* ``ideal_speedup = (R + T) / max(R, T)`` from a sync run's per-step rollout time R and
  train time T; ``overlap_efficiency = speedup / ideal_speedup``.

This module is the one definition of how phase events pair into busy intervals and what
the ratios mean: ``miles-harness simulate`` (``harness.sim.run_scenario.summarize``), the
main job (``harness.main_job.job``, ``miles-harness run``) and its timeline plots and
Chrome trace (``phase_spans``) all call it. Pairing: a phase's start opens it (a second
start while open is ignored), its end closes it, a phase still open at the end of the
window runs to that end, and overlapping intervals of one phase are merged. The window
is ``measurement_window``: from the first generate to the end of the last training
step (setup and teardown excluded), the same for simulated and real runs.
"""

from __future__ import annotations

import bisect

from typing import Any, Iterable

from miles_async_core import events as ev

Interval = tuple[float, float]


def intervals(events: Iterable[Any], side: str, phase: str, t_end: float) -> list[Interval]:
    """The phase's busy intervals, merged. Starts and ends pair per ``engine`` field (the
    ray layout's engines each record their own ``generating`` phase; events without it
    pair with each other), so with several engines the result is their union."""
    out, start = [], {}
    for e in events:
        if e.kind in (ev.PHASE_START, ev.PHASE_END) and e["side"] == side and e["phase"] == phase:
            key = e.fields.get("engine")
            if e.kind == ev.PHASE_START and key not in start:
                start[key] = e.t
            elif e.kind == ev.PHASE_END and key in start:
                out.append((start.pop(key), e.t))
    out += [(t, t_end) for t in start.values()]
    return merge(out)


def decode_intervals(events: Iterable[Any]) -> list[Interval]:
    """The engine's own busy intervals, ``[t - dur_s, t]`` of every ``decode_step``, merged."""
    return merge([(e.t - e["dur_s"], e.t) for e in events if e.kind == ev.DECODE_STEP])


def measurement_window(events: Iterable[Any], t0: float, t1: float) -> Interval:
    """From the first generate to the end of the last training step; ``(t0, t1)`` (the
    run's start and end) stand in when the trace has no generate / no finished step."""
    events = list(events)
    starts = [e.t for e in events if e.kind == ev.GENERATE_START]
    ends = [e.t for e in events if e.kind == ev.PHASE_END and e["side"] == "train" and e["phase"] == "training"]
    return (starts[0] if starts else t0, ends[-1] if ends else t1)


def phase_spans(events: Iterable[Any], window: Interval) -> list[list[Any]]:
    """``[[side, phase, t0_s, t1_s], ...]`` of every phase's busy intervals (paired and
    merged as ``intervals`` does), clipped to ``window`` and in seconds from its start:
    the timeline the plots and the Chrome trace draw."""
    events = list(events)
    lo, hi = window
    keys = list(dict.fromkeys((e["side"], e["phase"]) for e in events if e.kind in (ev.PHASE_START, ev.PHASE_END)))
    out: list[list[Any]] = []
    for side, phase in keys:
        for a, b in intervals(events, side, phase, hi):
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append([side, phase, round(a - lo, 6), round(b - lo, 6)])
    return sorted(out, key=lambda x: (x[2], x[3], x[0], x[1]))


def merge(iv: list[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(iv: list[Interval], window: Interval) -> float:
    lo, hi = window
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in iv)


def total_sorted(iv: list[Interval], ends: list[float], window: Interval) -> float:
    """``total(iv, window)`` for merged ``iv`` (sorted, disjoint; ``ends`` their ends): the
    same sum over the intervals that reach into the window alone (the others add 0), found
    by bisection, so many short windows cost O(log n) each instead of a pass over ``iv``."""
    lo, hi = window
    covered = 0.0
    for a, b in iv[bisect.bisect_left(ends, lo) :]:
        if a >= hi:
            break
        covered += max(0.0, min(b, hi) - max(a, lo))
    return covered


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_metrics(events: list[Any], window: Interval) -> dict[str, float]:
    """Busy seconds per phase and the ratios above, over ``window`` (see ``measurement_window``)."""
    t_end = window[1]
    gen = intervals(events, "rollout", "generating", t_end)
    decode = decode_intervals(events)
    engine = decode if decode else gen
    train = intervals(events, "train", "training", t_end)
    sync = intervals(events, "train", "weight_sync", t_end)
    wait = intervals(events, "train", "waiting", t_end)
    wall = max(1e-12, window[1] - window[0])
    busy_train = total(merge(train + sync), window)
    return {
        "wall_s": wall,
        "rollout_busy_s": total(gen, window),
        "train_busy_s": total(train, window),
        "weight_sync_s": total(sync, window),
        "train_waiting_s": total(wait, window),
        "decode_busy_s": total(decode, window),
        "both_busy_s": total(intersect(engine, train), window),
        "both_busy_fraction": total(intersect(engine, train), window) / wall,
        "rollout_idle_ratio": 1.0 - total(gen, window) / wall,
        "train_idle_ratio": 1.0 - busy_train / wall,
        "wait_time_ratio": total(wait, window) / wall,
    }


def ideal_speedup(rollout_s: float, train_s: float) -> float:
    return (rollout_s + train_s) / max(rollout_s, train_s, 1e-12)
