"""The simulator's speed path: ``FastVirtualTimeLoop``, chosen by
``$MILES_HARNESS_SIM_SPEED=fast`` (the default; ``harness.sim.vtime.loop_class``).

It runs the same callbacks in the same order as the reference ``VirtualTimeLoop``
(``harness.sim.vtime_plain``), with
less work per callback, and depends on CPython 3.11's asyncio internals
(``BaseEventLoop._run_once``, ``Handle``'s fields), which is why it is fenced here:

* ``call_soon``, ``call_at`` and ``_run_once`` are asyncio's own (CPython 3.11
  ``base_events``) with the per-callback Python overhead taken out, outside debug mode:
  handles are built without their ``__init__`` chain, the iteration runs each ready
  handle's callback in its context directly instead of through ``Handle._run``, and one
  ``_run_once`` call runs iterations until ``stop()`` (``run_forever``'s own loop). The
  order in which callbacks run, the timer heap and the clock arithmetic are unchanged.
* While callbacks are ready the loop does not poll the real selector, and before a clock
  jump it polls only when something may be there (a wake-up written by
  ``call_soon_threadsafe``, a signal handler, another registered file).
* The cyclic garbage collector runs with a larger first-generation threshold while the
  loop runs (``young_gc_threshold``): a simulation allocates millions of short-lived,
  acyclic objects, and the default threshold made the collector cost a large share of the
  CPU time while finding almost nothing to free.

``suites/harness/test_sim_speed_paths.py`` runs every golden and cross-Python scenario
on both loops and requires byte-identical traces; ``python -m harness.results.sim_paths_ab``
measures the gain of each part side by side.
"""

# This module reads and writes CPython 3.11's private asyncio fields and methods, which
# typeshed does not declare, and overrides call_soon/call_at with a positional-only callback:
# mypy's checks of those are off here, and only here.
# mypy: disable-error-code="attr-defined,has-type,method-assign,override,misc"

from __future__ import annotations

import contextlib
import contextvars
import gc
import heapq
from asyncio import base_events, events
from collections.abc import Iterator
from typing import Any

from harness.sim.vtime_plain import VirtualTimeLoop, _VirtualSelector
from harness.sim.watchdog import WATCHDOG_STRIDE

_Handle, _TimerHandle = events.Handle, events.TimerHandle
_new_handle = _Handle.__new__
_copy_context = contextvars.copy_context
_heappop, _heappush = heapq.heappop, heapq.heappush
# BaseEventLoop._run_once's thresholds for purging cancelled timers (CPython 3.11 base_events)
_MIN_SCHEDULED_TIMER_HANDLES, _MIN_CANCELLED_TIMER_HANDLES_FRACTION = 100, 0.5
_MAXIMUM_SELECT_TIMEOUT = base_events.MAXIMUM_SELECT_TIMEOUT


class _FastSelector(_VirtualSelector):
    """Polls the real selector before a clock jump only when something may be there; the
    watchdog is checked by ``FastVirtualTimeLoop._run_once``, not here."""

    def __init__(self) -> None:
        super().__init__()
        self._registered = 0
        # Something may have written to the loop's self-pipe since the last real poll
        # (``FastVirtualTimeLoop._write_to_self``: ``call_soon_threadsafe``).
        self.wakeup_pending = True

    def register(self, fileobj: Any, events: int, data: Any = None) -> Any:
        key = super().register(fileobj, events, data)
        self._registered += 1
        return key

    def unregister(self, fileobj: Any) -> Any:
        key = super().unregister(fileobj)
        self._registered -= 1
        return key

    def select(self, timeout: float | None = None) -> Any:
        if timeout == 0:
            return []
        loop = self.loop
        # Registered alone, the self-pipe has nothing to read unless a wake-up was written.
        if (self.wakeup_pending or timeout is None or self._registered != 1
                or loop is None or getattr(loop, "_signal_handlers", None)):
            self.wakeup_pending = False
            ready = self._real.select(0)
            if ready:
                return ready
        return self.jump(timeout)


class FastVirtualTimeLoop(VirtualTimeLoop):
    _vsel: _FastSelector

    def make_selector(self) -> _FastSelector:
        return _FastSelector()

    def run_context(self) -> contextlib.AbstractContextManager[None]:
        return young_gc_threshold()

    def _write_to_self(self) -> None:
        self._vsel.wakeup_pending = True  # before the write: a poll after it sees the byte
        super()._write_to_self()

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)
        # ``get_debug`` as a builtin bound to the current flag: every future and task
        # asyncio creates asks the loop ``get_debug()`` (C code calling a Python method).
        self.get_debug = (True if self._debug else False).__bool__

    def call_soon(self, callback: Any, /, *args: Any, context: contextvars.Context | None = None) -> events.Handle:
        # ``callback`` positional-only: C futures and tasks pass ``context=`` under a name
        # that is not the interned string, which CPython matches against each parameter
        # that could take a keyword, by value, in order
        if self._debug or self._closed:  # the stock checks (and their errors)
            return super().call_soon(callback, *args, context=context)
        handle = _new_handle(_Handle)  # what Handle.__init__ sets outside debug mode
        handle._context = _copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def call_at(self, when: float, callback: Any, *args: Any,
                context: contextvars.Context | None = None) -> events.TimerHandle:
        if when is None or self._debug or self._closed:
            return super().call_at(when, callback, *args, context=context)
        timer = _new_handle(_TimerHandle)  # what TimerHandle.__init__ sets outside debug mode
        timer._context = _copy_context() if context is None else context
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        _heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """Iterations of ``BaseEventLoop._run_once`` of CPython 3.11, step for step, outside
        debug mode, until ``stop()``: ``run_forever``'s loop, which calls this, ends after
        the iteration that stops it as well, so the two run the same iterations."""
        ready, sel = self._ready, self._vsel
        popleft = ready.popleft
        countdown = 1
        while not self._debug:
            countdown -= 1
            if not countdown:  # the watchdog every WATCHDOG_STRIDE iterations: a call each costs ~8%
                countdown = WATCHDOG_STRIDE
                if self.watchdog is not None:
                    self.watchdog.check(sel.now)
            scheduled = self._scheduled
            sched_count = len(scheduled)
            if (sched_count > _MIN_SCHEDULED_TIMER_HANDLES and
                    self._timer_cancelled_count / sched_count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
                new_scheduled = []
                for handle in scheduled:
                    if handle._cancelled:
                        handle._scheduled = False
                    else:
                        new_scheduled.append(handle)
                heapq.heapify(new_scheduled)
                self._scheduled = scheduled = new_scheduled
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0]._cancelled:
                    self._timer_cancelled_count -= 1
                    handle = _heappop(scheduled)
                    handle._scheduled = False

            if not ready and not self._stopping:
                # With callbacks ready (timeout 0) the virtual selector returns no events.
                timeout = None
                if scheduled:
                    timeout = min(max(0, scheduled[0]._when - sel.now), _MAXIMUM_SELECT_TIMEOUT)
                event_list = self._selector.select(timeout)
                if event_list:
                    self._process_events(event_list)
                event_list = None

            end_time = sel.now + self._clock_resolution
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = _heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)

            for _ in range(len(ready)):
                handle = popleft()
                if handle._cancelled:
                    continue
                cls = type(handle)
                if cls is not _Handle and cls is not _TimerHandle:
                    handle._run()
                    continue
                args = handle._args
                try:  # Handle._run
                    if len(args) == 1:  # most callbacks (a future's, a task's wake-up): no argument tuple to build
                        handle._context.run(handle._callback, args[0])
                    else:
                        handle._context.run(handle._callback, *args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    context = {"message": f"Exception in callback {handle!r}", "exception": exc, "handle": handle}
                    if handle._source_traceback:
                        context["source_traceback"] = handle._source_traceback
                    self.call_exception_handler(context)
            handle = None  # Needed to break cycles when an exception occurs.
            if self._stopping:
                return
        if self.watchdog is not None:
            self.watchdog.check(sel.now)
        super()._run_once()  # debug mode: one stock iteration


GC_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def young_gc_threshold(gen0: int | None = None) -> Iterator[None]:
    """Collect generation 0 every ``gen0`` net allocations (default 700), then restore.
    Cyclic garbage is still collected, only in larger batches."""
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
