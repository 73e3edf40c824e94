"""The simulator's two fast paths, held to what they replace.

* ``SimEngine.generate_group`` (the contract's optional ``generate_group``): the same
  requests, events and schedule as ``generate`` called per sample. Checked by running
  scenarios with it and with it declined (the core then calls ``generate`` per sample)
  and comparing their traces event for event.
* ``_Req`` keeps its own done callbacks so that one engine step's finished requests
  run theirs in one loop callback; otherwise it schedules them as asyncio's futures do.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.simulate import simulate
from harness.sim.trainer import SimTrainerConfig
from harness.sim.vtime import run_virtual
from miles_async_core.config import AsyncConfig
from miles_async_core.rollout import generate_and_rm_group
from miles_async_core.types import Sample, SamplingParams, Status

SCENARIOS = {
    "fully-async-retract": Scenario(config=AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, fully_async=True,
                                                       num_rollout=12), trainer=SimTrainerConfig(step_base_s=2.0)),
    "fully-async-in-place-failures": Scenario(
        config=AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, fully_async=True, num_rollout=12,
                           pause_generation_mode="in_place", async_unused_samples_handler="retry"),
        engine=SimEngineConfig(request_failure_rate=0.02, max_running=24), trainer=SimTrainerConfig(step_base_s=2.0)),
    "one-step-abort": Scenario(config=AsyncConfig(rollout_batch_size=8, n_samples_per_prompt=4, num_rollout=8,
                                                  pause_generation_mode="abort"),
                               trainer=SimTrainerConfig(step_base_s=1.0)),
}


def _trace(scenario: Scenario) -> list:
    result = simulate(scenario)
    return [e.to_json() for e in result.events], result.engine_stats, repr(result.error)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_generate_group_gives_the_trace_of_generate_per_sample(name, monkeypatch):
    scenario = SCENARIOS[name]
    fast = _trace(scenario)
    calls = []
    monkeypatch.setattr(SimEngine, "generate_group", lambda self, samples, sampling: calls.append(1))
    per_sample = _trace(scenario)
    assert calls, "the core never asked for generate_group"
    assert fast[1] == per_sample[1] and fast[2] == per_sample[2]
    assert len(fast[0]) == len(per_sample[0])
    for i, (a, b) in enumerate(zip(fast[0], per_sample[0])):
        assert a == b, f"event {i}: generate_group {a} != generate {b}"


def _group(n: int = 3, first: int = 0) -> list[Sample]:
    return [Sample(index=first + i, group_index=0, prompt_tokens=[0] * 4) for i in range(n)]


def _engine(cls: type = SimEngine) -> SimEngine:
    return cls(SimEngineConfig(response_length=LengthDist(kind="fixed", median=5)))


def test_a_subclass_that_overrides_generate_is_called_per_sample():
    seen = []

    class Counting(SimEngine):
        def generate(self, sample, sampling):
            seen.append(sample.index)
            return super().generate(sample, sampling)

    async def main():
        eng = _engine(Counting)
        assert eng.generate_group(_group(), SamplingParams()) is None
        return await generate_and_rm_group(eng, _group(), SamplingParams())

    group = run_virtual(main())
    assert seen == [0, 1, 2] and all(s.status is Status.COMPLETED for s in group)


def test_a_wrapper_that_forwards_attributes_keeps_its_own_generate():
    seen = []
    inner = _engine()

    class Wrapper:
        def __getattr__(self, name):
            return getattr(inner, name)

        def generate(self, sample, sampling):
            seen.append(sample.index)
            return inner.generate(sample, sampling)

    async def main():
        return await generate_and_rm_group(Wrapper(), _group(), SamplingParams())

    run_virtual(main())
    assert seen == [0, 1, 2]


def test_generate_group_declines_a_group_that_is_not_fresh():
    async def main():
        eng, group = _engine(), _group()
        group[1].status = Status.ABORTED
        return eng.generate_group(group, SamplingParams()), eng.stats["requests"]

    assert run_virtual(main()) == (None, 0)


# --- _Req's done callbacks ------------------------------------------------------------

def _order_of_callbacks(end) -> list:
    """The callbacks a request's future runs when ``end(eng, fut)`` ends it, in order."""
    order = []

    async def main():
        eng = _engine()
        [fut] = eng.generate_group(_group(1), SamplingParams())
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
        eng._on_cancel(fut)  # the engine forgets it, as a cancellation would

    assert _order_of_callbacks(end) == [("first", False), ("second", False), "after done"]


def test_one_steps_finishes_run_their_callbacks_in_order_and_an_error_reaches_the_handler():
    order, errors = [], []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
        eng = _engine()
        futs = eng.generate_group(_group(4), SamplingParams())  # the same length: one step finishes them
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
        [fut] = eng.generate_group(_group(1), SamplingParams())
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
