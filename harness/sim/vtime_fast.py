"""The simulator's speed path: ``FastVirtualTimeLoop``, chosen by
``$MILES_HARNESS_SIM_SPEED=fast`` (the default; ``harness.sim.vtime.loop_class``).

It is the reference ``VirtualTimeLoop`` (``harness.sim.vtime_plain``), the same callbacks
in the same order, with one trick: while it runs, the cyclic garbage collector runs with a
larger first-generation threshold (``young_gc_threshold``). A simulation allocates
millions of short-lived, acyclic objects, and the default threshold (700) made the
collector cost a large share of the CPU time while finding almost nothing to free. Side by
side against the reference loop in one run it gained 1.30x samples per CPU-second
(``results/bench/sim_paths_ab.json``, variant ``plain+gc``).

``suites/harness/test_sim_speed_paths.py`` runs every golden and cross-Python scenario on
both loops and requires byte-identical traces; ``python -m harness.results.sim_paths_ab``
measures the gain side by side.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from harness.sim.vtime_plain import VirtualTimeLoop

GC_GEN0_THRESHOLD = 50_000


class FastVirtualTimeLoop(VirtualTimeLoop):
    """``VirtualTimeLoop`` run under ``young_gc_threshold``."""

    def run_context(self) -> contextlib.AbstractContextManager[None]:
        return young_gc_threshold()


@contextlib.contextmanager
def young_gc_threshold(gen0: int | None = None) -> Iterator[None]:
    """Collect generation 0 every ``gen0`` net allocations (default ``GC_GEN0_THRESHOLD``;
    the interpreter's is 700), then restore. Cyclic garbage is still collected, only in
    larger batches."""
    gen0 = GC_GEN0_THRESHOLD if gen0 is None else gen0
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= gen0:  # disabled by the threshold, or already larger
        yield
        return
    gc.set_threshold(gen0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
