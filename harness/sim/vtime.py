"""Deterministic virtual time for asyncio: ``run_virtual(coro)`` runs a coroutine on a
fresh virtual-time loop, starting at t = 0.

One switch, ``$MILES_HARNESS_SIM_SPEED``, picks the loop (``loop_class``): ``fast`` (the
default) is the speed path of ``harness.sim.vtime_fast``; ``plain`` is the reference loop
of ``harness.sim.vtime_plain``, written with public asyncio only. Both run the same
callbacks in the same order and give byte-identical traces
(``suites/harness/test_sim_speed_paths.py``). ``VirtualTimeLoop`` (the reference loop) and
``VirtualDeadlock`` (every task blocked, no timer pending) are re-exported here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from typing import TypeVar

from harness.sim.vtime_fast import FastVirtualTimeLoop
from harness.sim.vtime_plain import VirtualDeadlock, VirtualTimeLoop
from harness.sim.watchdog import WatchdogTripped

__all__ = ["SPEED_ENV", "SPEEDS", "VirtualDeadlock", "VirtualTimeLoop", "loop_class", "run_virtual"]

T = TypeVar("T")

SPEED_ENV = "MILES_HARNESS_SIM_SPEED"
SPEEDS = ("fast", "plain")


def loop_class() -> type[VirtualTimeLoop]:
    """The loop ``run_virtual`` makes: by ``$MILES_HARNESS_SIM_SPEED``, ``fast`` (the default,
    ``harness.sim.vtime_fast.FastVirtualTimeLoop``) or ``plain`` (``harness.sim.vtime_plain.VirtualTimeLoop``)."""
    speed = os.environ.get(SPEED_ENV) or "fast"
    if speed == "plain":
        return VirtualTimeLoop
    if speed == "fast":
        return FastVirtualTimeLoop
    raise ValueError(
        f"{SPEED_ENV}={speed!r}: allowed {', '.join(SPEEDS)}; fix: set it to one of those, or unset it for fast"
    )


def run_virtual(main: Awaitable[T]) -> T:
    loop = loop_class()()
    try:
        with loop.run_context():
            return loop.run_until_complete(main)
    finally:
        try:
            # Creation order, not set order (which follows memory addresses): the order
            # of cancel() calls is the order cleanups run, so traces stay reproducible.
            pending = sorted((t for t in asyncio.all_tasks(loop) if not t.done()), key=_creation_order)
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except (VirtualDeadlock, WatchdogTripped):  # a task that will not end: closing reports it
            pass
        loop.close()


def _creation_order(task: asyncio.Task) -> tuple[int, str]:
    """asyncio names unnamed tasks ``Task-<n>`` from one process-wide counter."""
    name = task.get_name()
    suffix = name.rpartition("-")[2]
    return (int(suffix), name) if name.startswith("Task-") and suffix.isdigit() else (-1, name)
