"""What the harness's own recording costs inside a timed run, timed as it happens.

``SelfCost`` wraps the two things the harness puts into a real run's timed window (the
trace sink every event goes through and the age observer the drivers call at each weight
update and each trained batch) and adds up the wall time spent inside them
(``time.perf_counter`` around each call). ``in_run_s / run_s`` is then the share of the
timed run spent inside the recording's calls, on whichever thread made them. It is wall
time: a call that waits for the GIL while the trainer's or the engine reader's thread
runs counts that wait too, so on a busy process it can over-state the recording's own
work; and it leaves out what a caller builds before it emits (the core builds an
event's fields only when ``sink.enabled``) and an engine process's own event buffering. The
with-and-without comparison (``suites/bench/test_measurement_cost.py``) measures the
whole cost; this figure says how much of it is the recording itself, on every run, at
the price of two clock reads per call.
"""

from __future__ import annotations

import time
from typing import Any


def process_cpu_s(pid: int | None = None) -> float | None:
    """CPU seconds (user + system, every thread) a process has used so far: this process
    from ``time.process_time``, another from ``/proc/<pid>/stat`` (None where unreadable).
    With the engine process's figure added, ``run_cpu_s`` of a run is the CPU its timed
    window cost on both sides; unlike wall time it does not grow when the host gives the
    machine's cores to someone else, so a with-and-without comparison resolves smaller
    costs."""
    if pid is None:
        return time.process_time()
    import os

    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


class SelfCost:
    """Accumulates the wall time of the calls it wraps (``in_run_s``) and their count."""

    def __init__(self) -> None:
        self.in_run_s = 0.0
        self.calls = 0

    def sink(self, inner: Any) -> "_TimedSink":
        return _TimedSink(inner, self)

    def observer(self, inner: Any) -> "_TimedObserver":
        return _TimedObserver(inner, self)

    def summary(self, run_s: float) -> dict[str, Any]:
        return {
            "in_run_s": self.in_run_s,
            "calls": self.calls,
            "share_of_run": self.in_run_s / run_s if run_s > 0 else None,
        }


class _TimedSink:
    enabled = True

    def __init__(self, inner: Any, cost: SelfCost) -> None:
        self.inner, self.cost = inner, cost

    def emit(self, kind: str, /, **fields: Any) -> None:
        t0 = time.perf_counter()
        try:
            self.inner.emit(kind, **fields)
        finally:
            self.cost.in_run_s += time.perf_counter() - t0
            self.cost.calls += 1


class _TimedObserver:
    def __init__(self, inner: Any, cost: SelfCost) -> None:
        self.inner, self.cost = inner, cost

    def on_weights_updated(self, ctx: Any, version: int) -> None:
        t0 = time.perf_counter()
        try:
            self.inner.on_weights_updated(ctx, version)
        finally:
            self.cost.in_run_s += time.perf_counter() - t0
            self.cost.calls += 1

    def on_train_batch(self, ctx: Any, rollout_id: int, data: list) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            return self.inner.on_train_batch(ctx, rollout_id, data)
        finally:
            self.cost.in_run_s += time.perf_counter() - t0
            self.cost.calls += 1


__all__ = ["SelfCost", "process_cpu_s"]
