"""The future ``generate`` returns: its done callbacks run as any asyncio future's,
however it ends, and cancelling it takes the request out of the engine before they run."""

from __future__ import annotations

import asyncio

import pytest

from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.vtime import run_virtual
from miles_async_core.types import Sample, SamplingParams


def _group(n: int = 3, first: int = 0) -> list[Sample]:
    return [Sample(index=first + i, group_index=0, prompt_tokens=[0] * 4) for i in range(n)]


def _engine(cls: type = SimEngine) -> SimEngine:
    return cls(SimEngineConfig(response_length=LengthDist(kind="fixed", median=5)))


def _order_of_callbacks(end) -> list:
    """The callbacks a request's future runs when ``end(eng, fut)`` ends it, in order."""
    order = []

    async def main():
        eng = _engine()
        fut = eng.generate(_group(1)[0], SamplingParams())
        fut.add_done_callback(lambda f: order.append(("first", f.cancelled())))
        fut.add_done_callback(lambda f: order.append(("second", f.cancelled())))
        removed = lambda f: order.append("removed")  # noqa: E731
        fut.add_done_callback(removed)
        assert fut.remove_done_callback(removed) == 1
        end(eng, fut)
        await asyncio.sleep(1.0)
        fut.add_done_callback(lambda f: order.append("after done"))
        await asyncio.sleep(0)

    run_virtual(main())
    return order


def test_callbacks_run_in_order_when_the_engine_finishes_the_request():
    assert _order_of_callbacks(lambda eng, fut: None) == [("first", False), ("second", False), "after done"]


def test_callbacks_run_when_the_request_is_cancelled():
    assert _order_of_callbacks(lambda eng, fut: fut.cancel()) == [("first", True), ("second", True), "after done"]


@pytest.mark.parametrize("how", ["set_result", "set_exception"])
def test_callbacks_run_when_something_else_ends_the_future(how):
    def end(eng, fut):
        getattr(fut, how)(None if how == "set_result" else RuntimeError("ended elsewhere"))
        eng._on_cancel(next(r for r in eng.waiting if r.fut is fut))  # the engine forgets it, as a cancellation would

    assert _order_of_callbacks(end) == [("first", False), ("second", False), "after done"]


def test_one_steps_finishes_run_their_callbacks_in_order_and_an_error_reaches_the_handler():
    order, errors = [], []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
        eng = _engine()
        futs = [eng.generate(s, SamplingParams()) for s in _group(4)]  # the same length: one step finishes them
        for i, fut in enumerate(futs):
            if i == 1:
                fut.add_done_callback(lambda f: 1 / 0)
            fut.add_done_callback(lambda f, i=i: order.append(i))
        await asyncio.gather(*futs)
        await asyncio.sleep(0)

    run_virtual(main())
    assert order == [0, 1, 2, 3]
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)


def test_removing_callbacks_keeps_the_others_in_order():
    order = []

    async def main():
        eng = _engine()
        fut = eng.generate(_group(1)[0], SamplingParams())
        first = lambda f: order.append("first")  # noqa: E731
        fut.add_done_callback(first)
        fut.add_done_callback(lambda f: order.append("second"))
        fut.add_done_callback(first)
        fut.add_done_callback(lambda f: order.append("third"))
        removed = fut.remove_done_callback(first)
        await fut
        await asyncio.sleep(0)
        return removed, fut.remove_done_callback(first)

    assert run_virtual(main()) == (2, 0)
    assert order == ["second", "third"]


def test_a_cancelled_request_leaves_the_engine_before_its_callbacks_run():
    seen = []

    async def main():
        eng = _engine()
        futs = [eng.generate(s, SamplingParams()) for s in _group(2)]
        await asyncio.sleep(0)  # admitted: both run
        futs[0].add_done_callback(lambda f: seen.append(sorted(eng.running)))
        futs[0].cancel()
        await asyncio.gather(*futs, return_exceptions=True)
        return futs[1].result().status, eng.stats["requests"]

    assert run_virtual(main())[0].value == "completed"
    assert seen == [[1]]  # request 0 was gone from the running batch when its callback ran
