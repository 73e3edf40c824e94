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
        return data, loop.time(), len(loop._scheduled)

    with caplog.at_level(logging.WARNING, logger="miles_async_core.fully_async"):
        data, t, timers_left = run_virtual(main())
    assert data == [group] and t == 2.5 * NO_PROGRESS_WARN_SECS
    assert [r.getMessage() for r in caplog.records] == [f"No completed rollout groups for {NO_PROGRESS_WARN_SECS:.1f}s"] * 2
    assert timers_left == 0  # the last wait's timer went with it


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
