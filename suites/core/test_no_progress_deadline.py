"""The fully-async drain's no-progress timeout (``fully_async._Deadline``): one timer for
the successive waits of ``_next_group``, each released at its own deadline as by
``asyncio.wait(timeout=...)``'s own timer, and no cancelled timer left per wait."""

from __future__ import annotations

import asyncio

from harness.sim.vtime import run_virtual
from miles_async_core.fully_async import _Deadline, _wait_first


def test_a_wait_with_nothing_done_returns_at_its_timeout():
    async def main():
        loop = asyncio.get_running_loop()
        a, b = loop.create_future(), loop.create_future()
        await _wait_first(a, b, 30.0, _Deadline(loop))
        return loop.time(), a.done(), b.done()

    assert run_virtual(main()) == (30.0, False, False)


def test_a_later_wait_gets_its_own_full_timeout():
    """The first wait ends at t=10 (a future completed); the second starts then and must
    wait until t=40, though the one timer was set for t=30."""
    async def main():
        loop = asyncio.get_running_loop()
        deadline = _Deadline(loop)
        a, b = loop.create_future(), loop.create_future()
        loop.call_later(10.0, a.set_result, None)
        await _wait_first(a, b, 30.0, deadline)
        t1 = loop.time()
        c, d = loop.create_future(), loop.create_future()
        await _wait_first(c, d, 30.0, deadline)
        return t1, loop.time()

    assert run_virtual(main()) == (10.0, 40.0)


def test_a_shorter_timeout_than_the_pending_timer_is_kept():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = _Deadline(loop)
        a, b = loop.create_future(), loop.create_future()
        loop.call_later(1.0, a.set_result, None)
        await _wait_first(a, b, 30.0, deadline)  # leaves the timer set for t=30
        c, d = loop.create_future(), loop.create_future()
        await _wait_first(c, d, 5.0, deadline)
        return loop.time()

    assert run_virtual(main()) == 6.0


def test_waits_that_end_early_leave_one_timer_not_one_per_wait():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = _Deadline(loop)
        for _ in range(500):
            a, b = loop.create_future(), loop.create_future()
            loop.call_soon(a.set_result, None)
            await _wait_first(a, b, 30.0, deadline)
        return len(loop._scheduled), a.done(), b.done()

    scheduled, a_done, b_done = run_virtual(main())
    assert scheduled == 1 and a_done and not b_done


def test_callbacks_are_removed_from_both_futures():
    async def main():
        loop = asyncio.get_running_loop()
        a, b = loop.create_future(), loop.create_future()
        loop.call_soon(a.set_result, None)
        await _wait_first(a, b, 30.0, _Deadline(loop))
        return b._callbacks

    assert not run_virtual(main())
