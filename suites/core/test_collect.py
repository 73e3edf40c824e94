"""``miles_async_core.collect``: a wait for every future that takes the same loop steps on
every Python (CPython 3.12 completes a ``gather`` of done futures inline)."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from harness.sim.vtime import run_virtual
from miles_async_core.collect import collect


def _steps(wait) -> list[str]:
    """What runs in which order around a wait for futures that are all done already."""
    log: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        a, b = loop.create_future(), loop.create_future()
        a.set_result(1)
        b.set_exception(ValueError("b"))
        loop.call_soon(log.append, "queued before the wait")
        await wait([a, b])
        log.append("waiter resumed")

    run_virtual(main())
    return log


def test_done_futures_are_collected_through_the_loop_not_inline():
    assert _steps(collect) == ["queued before the wait", "waiter resumed"]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="3.11's gather is the reference; 3.12 changed it")
def test_on_3_11_it_takes_the_steps_gather_takes():
    assert _steps(collect) == _steps(lambda fs: asyncio.gather(*fs, return_exceptions=True))


def test_every_exception_is_retrieved():
    reported: list[dict] = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        futs = [loop.create_future() for _ in range(3)]
        for i, f in enumerate(futs):
            loop.call_later(i, f.set_exception, RuntimeError(i))
        await collect(futs)
        del futs
        gc.collect()

    run_virtual(main())
    assert not [c for c in reported if "never retrieved" in c.get("message", "")]


def test_cancelling_the_waiter_cancels_the_children_and_waits_for_them():
    async def main():
        loop = asyncio.get_running_loop()
        children = [loop.create_future(), loop.create_future()]
        children[1].add_done_callback(lambda f: None)
        waiter = loop.create_task(collect(children))
        await asyncio.sleep(1.0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return [c.cancelled() for c in children], loop.time()

    assert run_virtual(main()) == ([True, True], 1.0)


def test_a_child_that_refuses_cancellation_is_still_waited_for():
    """A task that catches its cancellation and goes on: the wait ends when it ends."""

    async def stubborn():
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:
            await asyncio.sleep(2.0)
        return "done"

    async def main():
        loop = asyncio.get_running_loop()
        child = loop.create_task(stubborn())
        waiter = loop.create_task(collect([child]))
        await asyncio.sleep(1.0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return child.result(), loop.time()

    assert run_virtual(main()) == ("done", 3.0)


def test_nothing_to_collect_returns_at_once():
    async def main():
        await collect([])
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == 0.0
