"""``collect(futures)``: wait for every future and retrieve every outcome, with one loop
step order on every Python.

It is ``await asyncio.gather(*futures, return_exceptions=True)`` as CPython 3.11 runs it:
each future reports through a done callback the loop runs (a future already done
schedules its callback with ``call_soon``), the last callback completes the wait, and
the waiting task resumes one loop step later. Cancelling the waiting task cancels the
futures and still waits for them, then raises ``CancelledError``.

The project's rule is that a trace's order follows from the loop's queue, never from
how a Python version shortcuts it. CPython 3.12 added a shortcut to ``gather``: when
every future is already done, the gather completes inline and the waiting task goes
on in the same step. A group whose requests were just cancelled then recorded its
``group_done`` before the engine's cancellation callbacks ran (the engine's
``phase_end`` came second), so the same seed gave a different trace on 3.12 and 3.13.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable


class _Collecting(asyncio.Future[Any]):
    """The outer future of one ``collect``: done when every child is done."""

    def __init__(self, children: list[asyncio.Future[Any]], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._children = children
        self._remaining = len(children)
        self._cancel_requested = False
        for child in children:
            child.add_done_callback(self._child_done)

    def _child_done(self, child: asyncio.Future[Any]) -> None:
        self._remaining -= 1
        if not child.cancelled():
            child.exception()  # retrieved, as return_exceptions=True does
        if self.done() or self._remaining:
            return
        if self._cancel_requested:
            super().cancel()
        else:
            self.set_result(None)

    def cancel(self, msg: Any = None) -> bool:
        """The waiting task was cancelled: cancel the children; the wait ends (cancelled)
        when the last of them is done. False when none could be cancelled, so the task
        raises ``CancelledError`` at its next step instead."""
        if self.done():
            return False
        cancelled = False
        for child in self._children:
            if child.cancel(msg):
                cancelled = True
        if cancelled:
            self._cancel_requested = True
        return cancelled


async def collect(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until every future is done; never raises what they raised."""
    children = list(dict.fromkeys(futures))
    if not children:
        return
    await _Collecting(children, asyncio.get_running_loop())
