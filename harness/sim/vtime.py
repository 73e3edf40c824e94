"""Deterministic virtual time for asyncio.

``VirtualTimeLoop`` is a selector event loop whose clock only moves when every task is
blocked: where a real loop would sleep in ``select(timeout)`` until the next timer, it
jumps the clock straight to that timer (trio's ``MockClock`` with autojump, as a loop).
No real time passes, so a simulated hour costs what its callbacks cost.

If every task is blocked and no timer is pending, nothing can ever happen again: the
loop raises ``VirtualDeadlock`` instead of hanging, naming the blocked tasks.

``run_virtual(coro)`` runs a coroutine on a fresh loop, starting at t = 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import heapq
from asyncio import base_events, events
import selectors
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")


class VirtualDeadlock(RuntimeError):
    """Every task waits and no timer is pending: the simulated system is stuck."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list:
        # What is there now (a thread's wake-up, a signal, other files) comes first; the
        # clock jumps only when nothing is
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()] if self.loop else []
            names = ", ".join(sorted(t.get_coro().__qualname__ for t in tasks)[:12])
            raise VirtualDeadlock(f"virtual time t={self.now:.6f}s: every task is blocked and no timer is "
                                  f"pending ({len(tasks)} tasks: {names})")
        self.now += timeout
        return []


_Handle, _TimerHandle = events.Handle, events.TimerHandle
# BaseEventLoop._run_once's thresholds for purging cancelled timers (CPython 3.11 base_events)
_MIN_SCHEDULED_TIMER_HANDLES, _MIN_CANCELLED_TIMER_HANDLES_FRACTION = 100, 0.5


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        sel = _VirtualSelector()
        super().__init__(sel)
        sel.loop = self
        self._vsel = sel

    def time(self) -> float:
        return self._vsel.now

    # kept for speed (x1.12 in the A/B): asyncio's scheduling without its per-callback Python frames
    def call_soon(self, callback: Any, *args: Any, context: contextvars.Context | None = None) -> events.Handle:
        if self._debug or self._closed:  # the stock checks (and their errors)
            return super().call_soon(callback, *args, context=context)
        handle = _Handle.__new__(_Handle)  # what Handle.__init__ sets outside debug mode
        handle._context = contextvars.copy_context() if context is None else context
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
        timer = _TimerHandle.__new__(_TimerHandle)  # what TimerHandle.__init__ sets outside debug mode
        timer._context = contextvars.copy_context() if context is None else context
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """Iterations of ``BaseEventLoop._run_once`` of CPython 3.11, step for step, outside
        debug mode, until ``stop()``: ``run_forever``'s loop, which calls this, ends after
        the iteration that stops it as well, so the two run the same iterations."""
        ready, sel = self._ready, self._vsel
        while not self._debug:
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
                    handle = heapq.heappop(scheduled)
                    handle._scheduled = False

            timeout = None
            if ready or self._stopping:
                timeout = 0
            elif scheduled:
                timeout = min(max(0, scheduled[0]._when - sel.now), base_events.MAXIMUM_SELECT_TIMEOUT)
            event_list = self._selector.select(timeout)
            self._process_events(event_list)
            event_list = None

            end_time = sel.now + self._clock_resolution
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)

            for _ in range(len(ready)):
                handle = ready.popleft()
                if handle._cancelled:
                    continue
                if type(handle) is not _Handle and type(handle) is not _TimerHandle:
                    handle._run()
                    continue
                try:  # Handle._run
                    handle._context.run(handle._callback, *handle._args)
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
        super()._run_once()  # debug mode: one stock iteration


GC_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def _young_gc_threshold(gen0: int = GC_GEN0_THRESHOLD) -> Any:
    """Collect generation 0 every ``gen0`` net allocations (default 700), then restore.
    Cyclic garbage is still collected, only in larger batches."""
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= gen0:  # disabled by the threshold, or already larger
        yield
        return
    gc.set_threshold(gen0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_virtual(main: Awaitable[T]) -> T:
    loop = VirtualTimeLoop()
    try:
        # kept for speed (x1.20 in the A/B): millions of short-lived objects, few cycles to find
        with _young_gc_threshold():
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
        except VirtualDeadlock:
            pass
        loop.close()


def _creation_order(task: asyncio.Task) -> tuple[int, str]:
    """asyncio names unnamed tasks ``Task-<n>`` from one process-wide counter."""
    name = task.get_name()
    suffix = name.rpartition("-")[2]
    return (int(suffix), name) if name.startswith("Task-") and suffix.isdigit() else (-1, name)
