"""The fully-async drain waits for a group or the worker's end, and warns after each
``NO_PROGRESS_WARN_SECS`` without either (`fully_async_rollout.py`'s drain loop)."""

from __future__ import annotations

import asyncio
import logging

from harness.sim.vtime import run_virtual
from miles_async_core.config import AsyncConfig
from miles_async_core.fully_async import NO_PROGRESS_WARN_SECS, FullyAsyncRolloutFn
from miles_async_core.types import DataBufferInput, Sample, SamplingParams


def test_a_drain_warns_once_per_timeout_without_progress_then_takes_the_group(caplog):
    config = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, fully_async=True)
    fn = FullyAsyncRolloutFn(config, None, None, sampling=SamplingParams())
    group = [Sample(index=0, group_index=0)]

    class Buffer:
        async def get(self, current_version=None, **context):
            await asyncio.sleep(2.5 * NO_PROGRESS_WARN_SECS)
            return DataBufferInput(prompt_group=group, group=group)

        def get_metrics(self):
            return {}

    async def main():
        loop = asyncio.get_running_loop()
        fn.buffer, fn._worker = Buffer(), loop.create_future()
        data, _ = await fn._drain(0, 1)
        return data, loop.time(), sum(not h.cancelled() for h in loop._scheduled)

    with caplog.at_level(logging.WARNING, logger="miles_async_core.fully_async"):
        data, t, timers_left = run_virtual(main())
    assert data == [group] and t == 2.5 * NO_PROGRESS_WARN_SECS
    assert [r.getMessage() for r in caplog.records] == [
        f"No completed rollout groups for {NO_PROGRESS_WARN_SECS:.1f}s"
    ] * 2
    assert timers_left == 0  # the drain's warning timer went with it


def test_a_worker_that_dies_while_the_drain_waits_fails_the_drain_at_once():
    config = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, fully_async=True)
    fn = FullyAsyncRolloutFn(config, None, None, sampling=SamplingParams())

    class Buffer:
        async def get(self, current_version=None, **context):
            await asyncio.get_running_loop().create_future()  # never

    async def main():
        loop = asyncio.get_running_loop()
        fn.buffer, fn._worker = Buffer(), loop.create_future()
        loop.call_later(5.0, fn._worker.set_exception, RuntimeError("worker died"))
        try:
            await fn._drain(0, 1)
        except RuntimeError as exc:
            return str(exc), loop.time()

    assert run_virtual(main()) == ("worker died", 5.0)


def test_warnings_count_from_the_last_group_as_upstreams_wait_per_group_does():
    # upstream waits anew for each group (a 30 s timeout per wait): a group at t=20 and the
    # next at t=85 give warnings at 50 and 80, none at 30 or 60
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=1, fully_async=True)
    fn = FullyAsyncRolloutFn(config, None, None, sampling=SamplingParams())
    groups = [[Sample(index=i, group_index=i)] for i in range(2)]
    arrivals = iter(zip([20.0, 85.0], groups))  # (when the group is there, the group)

    class Buffer:
        async def get(self, current_version=None, **context):
            at, group = next(arrivals)
            await asyncio.sleep(at - asyncio.get_running_loop().time())
            return DataBufferInput(prompt_group=group, group=group)

        def get_metrics(self):
            return {}

    warned_at = []

    class AtLoopTime(logging.Handler):
        def emit(self, record):
            warned_at.append(asyncio.get_running_loop().time())

    async def main():
        loop = asyncio.get_running_loop()
        fn.buffer, fn._worker = Buffer(), loop.create_future()
        data, _ = await fn._drain(0, 1)
        return data, loop.time()

    handler = AtLoopTime(level=logging.WARNING)
    logger = logging.getLogger("miles_async_core.fully_async")
    logger.addHandler(handler)
    try:
        data, t = run_virtual(main())
    finally:
        logger.removeHandler(handler)
    assert data == groups and t == 85.0
    assert warned_at == [20.0 + NO_PROGRESS_WARN_SECS, 20.0 + 2 * NO_PROGRESS_WARN_SECS]
