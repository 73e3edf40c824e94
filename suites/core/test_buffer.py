"""DefaultDataBuffer: Miles' upstream buffer tests (``tests/fast/rollout/test_fully_async_rollout.py``),
ported, plus the decisions this harness takes where upstream's docs and code disagree."""

from __future__ import annotations

import asyncio

import pytest

from harness.sim.vtime import run_virtual
from miles_async_core.buffer import DefaultDataBuffer
from miles_async_core.config import AsyncConfig
from miles_async_core.types import DataBufferConstructorInput, DataBufferInput, Sample, Status

P = "rollout/fully_async/"


def make_group(gi: int, versions: list[list[str]], status: Status = Status.COMPLETED) -> list[Sample]:
    return [Sample(index=gi * 10 + i, group_index=gi, weight_versions=v, status=status) for i, v in enumerate(versions)]


def entry(gi: int, versions: list[list[str]] | None = None, status: Status = Status.COMPLETED) -> DataBufferInput:
    g = make_group(gi, versions or [["1"], ["1"]], status)
    return DataBufferInput(prompt_group=g, group=g)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, prompt_group: list[Sample], cause: str = "unknown") -> None:
        self.calls.append((prompt_group[0].group_index, cause))


def make_buffer(handler: Recorder | None = None, **cfg) -> DefaultDataBuffer:
    args = AsyncConfig(**{"rollout_batch_size": 2, "n_samples_per_prompt": 2, "fully_async": True, **cfg})
    return DefaultDataBuffer(DataBufferConstructorInput(args, handler or Recorder()))


def test_buffer_blocks_producer_when_full_and_keeps_fifo_order():
    async def main():
        buf = make_buffer(async_data_buffer_capacity_factor=1.0)  # capacity int(1.0 * 2) = 2
        await buf.put(entry(0))
        await buf.put(entry(1))
        third = asyncio.ensure_future(buf.put(entry(2)))
        await asyncio.sleep(0)
        assert not third.done()
        assert buf.get_metrics()[P + "queue_size"] == 2.0
        got = await buf.get()
        await asyncio.sleep(0)
        assert third.done()
        order = [
            got.group[0].group_index,
            (await buf.get()).group[0].group_index,
            (await buf.get()).group[0].group_index,
        ]
        return order

    assert run_virtual(main()) == [0, 1, 2]


def test_buffer_get_ignores_unknown_context_keys():
    async def main():
        buf = make_buffer()
        await buf.put(entry(0))
        return await buf.get(current_version=1, rollout_id=3, anything="else")

    assert run_virtual(main()).group[0].group_index == 0


def test_aborted_group_is_rejected_at_put_and_handed_to_the_handler_once():
    handler = Recorder()

    async def main():
        buf = make_buffer(handler)
        await buf.put(entry(0, status=Status.ABORTED))
        return buf.get_metrics()

    m = run_virtual(main())
    assert handler.calls == [(0, "aborted")]
    assert m[P + "aborted_groups_filtered"] == 1.0 and m[P + "queue_size"] == 0.0


def test_nested_group_with_one_aborted_trajectory_is_rejected():
    handler = Recorder()

    async def main():
        buf = make_buffer(handler)
        flat = make_group(0, [["1"], ["1"]])
        nested = [[flat[0]], [flat[1], Sample(index=99, group_index=0, status=Status.ABORTED)]]
        await buf.put(DataBufferInput(prompt_group=flat, group=nested))
        return len(buf)

    assert run_virtual(main()) == 0
    assert handler.calls == [(0, "aborted")]


def test_dynamic_filter_reject_is_dropped_without_the_handler_and_counted_by_reason():
    handler = Recorder()

    class Out:
        keep, reason = False, "zero_std_1.0"

    async def main():
        args = AsyncConfig(
            rollout_batch_size=2, n_samples_per_prompt=2, fully_async=True, async_unused_samples_handler="retry"
        )
        object.__setattr__(args, "dynamic_sampling_filter", lambda a, g: Out())
        buf = DefaultDataBuffer(DataBufferConstructorInput(args, handler))
        await buf.put(entry(0))
        return buf.get_metrics()

    m = run_virtual(main())
    assert handler.calls == []
    assert m["rollout/dynamic_filter/drop_zero_std_1.0"] == 1.0


@pytest.mark.parametrize("out, kept", [(None, False), (False, False), (0, False), (True, True), (1, True)])
def test_dynamic_filter_output_that_is_not_a_filter_output_is_read_as_keep(out, kept):
    """Any return but a ``DynamicFilterOutput`` is wrapped as ``keep=output``
    (`filter_hub/base_types.py:L17-L19`), so ``None`` drops the group, with no drop metric.
    No filter at all keeps."""
    from miles_async_core.buffer import call_dynamic_filter

    assert call_dynamic_filter(lambda a, g: out, None, []) == (kept, None)
    assert call_dynamic_filter(None, None, []) == (True, None)
    handler = Recorder()

    async def main():
        args = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, fully_async=True)
        object.__setattr__(args, "dynamic_sampling_filter", lambda a, g: out)
        buf = DefaultDataBuffer(DataBufferConstructorInput(args, handler))
        await buf.put(entry(0))
        return len(buf), buf.get_metrics()

    size, m = run_virtual(main())
    assert size == int(kept) and handler.calls == []
    assert not any(k.startswith("rollout/dynamic_filter/") for k in m)


def test_buffer_get_skips_groups_stale_at_consumption_time_and_hands_them_to_the_handler():
    handler = Recorder()

    async def main():
        buf = make_buffer(handler, max_weight_staleness=2)
        await buf.put(entry(0, [["5"], ["10"]]))  # oldest 5: staleness 5 at version 10
        await buf.put(entry(1, [["9"], ["10"]]))  # staleness 1
        got = await buf.get(current_version=10)
        return got, buf.get_metrics()

    got, m = run_virtual(main())
    assert got.group[0].group_index == 1
    assert handler.calls == [(0, "stale")]
    assert m[P + "stale_groups_filtered"] == 1.0
    # consumed staleness includes the filtered group, as upstream's code computes it
    assert m[P + "max_staleness"] == 5.0 and m[P + "avg_staleness"] == 3.0


def test_staleness_uses_the_oldest_numeric_version_and_ignores_default():
    async def main():
        buf = make_buffer(max_weight_staleness=0)
        await buf.put(entry(0, [["default", "3"], ["4"]]))
        return await asyncio.wait_for(buf.get(current_version=3), timeout=1.0)

    assert run_virtual(main()).group[0].group_index == 0


def test_staleness_filter_is_off_before_the_first_weight_update():
    async def main():
        buf = make_buffer(max_weight_staleness=0)
        await buf.put(entry(0, [["1"], ["1"]]))
        got = await buf.get(current_version=None)
        return got, buf.get_metrics()

    got, m = run_virtual(main())
    assert got.group[0].group_index == 0
    assert P + "max_staleness" not in m and P + "buffer_max_staleness" not in m


def test_buffer_staleness_metrics_use_the_last_seen_version_and_reset_each_window():
    async def main():
        buf = make_buffer(async_data_buffer_capacity_factor=10.0)
        for gi, v in enumerate(["1", "3", "4"]):
            await buf.put(entry(gi, [[v], [v]]))
        await buf.get(current_version=7)  # pops the group at version 1: staleness 6
        first = buf.get_metrics()
        second = buf.get_metrics()
        return first, second

    first, second = run_virtual(main())
    assert first[P + "avg_staleness"] == 6.0
    assert first[P + "buffer_avg_staleness"] == 3.5 and first[P + "buffer_max_staleness"] == 4.0
    assert P + "avg_staleness" not in second and second[P + "stale_groups_filtered"] == 0.0
    assert second[P + "buffer_max_staleness"] == 4.0  # a gauge over what is still buffered


@pytest.mark.parametrize("factor,b,capacity", [(2.0, 8, 16), (1.5, 3, 4), (0.5, 2, 1)])
def test_capacity_is_floor_of_factor_times_batch(factor, b, capacity):
    buf = make_buffer(async_data_buffer_capacity_factor=factor, rollout_batch_size=b)
    assert buf.capacity == capacity


def test_iter_samples_flattens_one_level_as_upstream():
    """Upstream's iter_samples (fully_async_data_buffer.py:L28-L33) flattens one level: a
    list item is a trajectory whose items are yielded as they are."""
    from miles_async_core.types import first_sample, iter_samples, samples_of

    a, b, c = (Sample(index=i, group_index=0) for i in range(3))
    assert list(iter_samples([a, b])) == samples_of([a, b]) == [a, b]
    assert list(iter_samples([[a], [b, c]])) == samples_of([[a], [b, c]]) == [a, b, c]
    assert list(iter_samples([[a], [[b]]])) == samples_of([[a], [[b]]]) == [a, [b]]
    assert first_sample([[a, b]]) is a
