"""How many of the host's cores a run's processes kept busy over its timed window.

``main``: this process (the driver and the trainer, as in Miles' single-controller
layout where the rollout manager and the training loop share the driver); ``engines``:
each engine process this host can read (the split layout's engine process, the Ray
layout's engine actors on this host; ``/proc/<pid>/stat``, so Linux only). A figure near
the host's core count means the host is saturated: whatever overlap the modes gain is
then paid for by each side running slower (``harness.measure.overlap_loss``'s contention
parts), and an engine on such a host cannot be predicted as if it had its own hardware
(``results/advise/validation_ray.md``).

``snapshot`` before and after the window, ``cores`` turns the two into core counts: CPU
seconds over wall seconds, per process and in total (None where a process was unreadable).
"""

from __future__ import annotations

import os
from typing import Any

from harness.measure.self_cost import process_cpu_s


def snapshot(engine_pids: list[int]) -> dict[str, Any]:
    """CPU seconds so far of this process and of each engine process."""
    return {"main": process_cpu_s(), "engines": [process_cpu_s(pid) for pid in engine_pids]}


def cores(before: dict[str, Any], after: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Cores kept busy over ``wall_s``: ``cpu_cores_main``, ``cpu_cores_per_engine``,
    ``cpu_cores_engines`` (their sum; None if one was unreadable), ``cpu_cores_total``
    and ``host_cpu_count``."""

    def rate(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or wall_s <= 0 else (b - a) / wall_s

    main = rate(before["main"], after["main"])
    per_engine = [rate(a, b) for a, b in zip(before["engines"], after["engines"])]
    known = [x for x in per_engine if x is not None]
    engines = sum(known) if len(known) == len(per_engine) else None
    total = None if main is None or engines is None else main + engines
    return {
        "cpu_cores_main": main,
        "cpu_cores_per_engine": per_engine,
        "cpu_cores_engines": engines,
        "cpu_cores_total": total,
        "host_cpu_count": os.cpu_count(),
    }
