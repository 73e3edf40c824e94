"""The simulator's reference loop: asyncio's own selector event loop on a virtual clock.

``VirtualTimeLoop``'s clock only moves when every task is blocked: where a real loop would
sleep in ``select(timeout)`` until the next timer, its selector jumps the clock straight to
that timer (trio's ``MockClock`` with autojump, as a loop). No real time passes, so a
simulated hour costs what its callbacks cost. It is written with asyncio's public extension
points only: the selector given to ``SelectorEventLoop`` and the loop's ``time()``.

The selector is also where the progress watchdog (``harness.sim.watchdog``) is checked:
asyncio's loop calls ``select`` once per iteration, and every ``WATCHDOG_STRIDE`` calls
the selector calls ``loop.watchdog.check(now)``.

If every task is blocked and no timer is pending, nothing can ever happen again: the
loop raises ``VirtualDeadlock`` instead of hanging, naming the blocked tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harness.sim.watchdog import WATCHDOG_STRIDE

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike as _FileObject

    from harness.sim.watchdog import Watchdog


class VirtualDeadlock(RuntimeError):
    """Every task waits and no timer is pending: the simulated system is stuck."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0
        self.loop: VirtualTimeLoop | None = None
        self._countdown = 1  # select() calls until the next watchdog check

    def register(self, fileobj: _FileObject, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: _FileObject) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: _FileObject, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[_FileObject, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._countdown -= 1
        if not self._countdown:  # asyncio's loop calls select() once per iteration
            self._countdown = WATCHDOG_STRIDE
            if self.loop is not None and self.loop.watchdog is not None:
                self.loop.watchdog.check(self.now)
        if timeout == 0:  # callbacks are ready: no clock jump
            return []
        # Before a clock jump, poll the real selector for what may be there: a thread's
        # wake-up (``call_soon_threadsafe``), a signal (its handlers write to the loop's
        # self-pipe from C), other files.
        ready = self._real.select(0)
        if ready:
            return ready
        return self.jump(timeout)

    def jump(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        """Move the clock by ``timeout`` (the wait until the next timer); with no timer
        (``None``), raise ``VirtualDeadlock`` naming the blocked tasks."""
        if timeout is None:
            tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()] if self.loop else []
            names = ", ".join(sorted(getattr(t.get_coro(), "__qualname__", t.get_name()) for t in tasks)[:12])
            raise VirtualDeadlock(
                f"virtual time t={self.now:.6f}s: every task is blocked and no timer is "
                f"pending ({len(tasks)} tasks: {names})"
            )
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The reference loop: asyncio's own on a virtual clock (see the module docstring)."""

    watchdog: Watchdog | None = None  # put there by harness.sim.watchdog.install

    def __init__(self) -> None:
        sel = self.make_selector()
        super().__init__(sel)
        sel.loop = self
        self._vsel = sel

    def make_selector(self) -> _VirtualSelector:
        return _VirtualSelector()

    def time(self) -> float:
        return self._vsel.now

    def run_context(self) -> contextlib.AbstractContextManager[None]:
        """What ``run_virtual`` holds while the loop runs (nothing here; the speed path's
        garbage-collector setting)."""
        return contextlib.nullcontext()
