"""Generate functions and nested groups (``--custom-generate-function-path``): a call of
``--custom-generate-function-path`` may return a list of samples per prompt sample; the
group is then ``n`` trajectories, checked at the top level (``len(group) == n``,
``fully_async_rollout.py:L171``, ``inference_rollout_train.py:L138``) and flattened one level
where samples are read (``fully_async_data_buffer.py:L28-L43``). A fake engine stands in:
each request completes at once with the engine's version."""

from __future__ import annotations

import asyncio
import copy

import pytest

from miles_async_core import events as ev
from miles_async_core.buffer import DefaultDataBuffer
from miles_async_core.config import AsyncConfig
from miles_async_core.data_source import RolloutDataSourceWithBuffer
from miles_async_core.fully_async import FullyAsyncRolloutFn
from miles_async_core.generate import GenerateFnInput, GenerateFnOutput, generate, generate_and_rm
from miles_async_core.rollout import OneStepRollout, generate_and_rm_group
from miles_async_core.types import (
    DataBufferConstructorInput,
    DataBufferInput,
    Sample,
    SamplingParams,
    Status,
    samples_of,
)
from harness.trace import TraceRecorder

SAMPLING = SamplingParams(max_new_tokens=4)


class FakeEngine:
    """Completes every request on the next loop step with ``version``'s stamp."""

    def __init__(self, version: int = 1) -> None:
        self.version = version
        self.requests: list[int] = []

    async def generate(self, sample: Sample, sampling: SamplingParams) -> Sample:
        self.requests.append(sample.index)
        await asyncio.sleep(0)
        sample.response_tokens = sample.response_tokens + [7, 7]
        sample.weight_versions = sample.weight_versions + [str(self.version)]
        sample.status = Status.COMPLETED
        return sample

    async def abort_requests(self) -> None:
        pass


def two_turns(added_reward: float | None = None):
    """A generate function returning the prompt sample and one added sample (index + 100)."""

    async def fn(input: GenerateFnInput) -> GenerateFnOutput:
        template = copy.deepcopy(input.sample)
        await generate(input)
        added = copy.deepcopy(template)
        added.index += 100
        added.reward = added_reward
        input.gen_start(added)
        await generate(GenerateFnInput(engine=input.engine, sample=added, sampling_params=input.sampling_params))
        return GenerateFnOutput(samples=[input.sample, added])

    return fn


def test_a_list_output_rewards_only_its_unrewarded_samples():
    """``inference_rollout_common.py:L122-L124`` (upstream's ``test_multi_sample.py``: an
    existing reward is kept)."""
    s = Sample(index=1, group_index=0)
    out = asyncio.run(generate_and_rm(two_turns(added_reward=0.5), FakeEngine(), s, SAMPLING, reward_fn=lambda x: 1.0))
    assert [x.index for x in out] == [1, 101]
    assert [x.reward for x in out] == [1.0, 0.5]


def test_a_list_output_with_an_aborted_sample_is_not_rewarded():
    """``inference_rollout_common.py:L119-L120``."""

    async def fn(input: GenerateFnInput) -> GenerateFnOutput:
        a, b = Sample(index=1, status=Status.COMPLETED), Sample(index=2, status=Status.ABORTED)
        return GenerateFnOutput(samples=[a, b])

    out = asyncio.run(generate_and_rm(fn, FakeEngine(), Sample(index=1), SAMPLING, reward_fn=lambda x: 1.0))
    assert [x.reward for x in out] == [None, None]


def test_a_finished_sample_is_kept_without_calling_the_generate_function():
    """``inference_rollout_common.py:L70-L75`` (a resumed --partial-rollout sample)."""

    async def fn(input: GenerateFnInput) -> GenerateFnOutput:
        raise AssertionError("called")

    s = Sample(index=1, status=Status.COMPLETED, reward=0.0)
    assert asyncio.run(generate_and_rm(fn, FakeEngine(), s, SAMPLING)) is s


def test_a_group_of_list_returning_calls_is_n_trajectories_and_records_added_samples():
    group = [Sample(index=i, group_index=3) for i in range(2)]
    sink, done = TraceRecorder(lambda: 0.0, strict=True), []
    out = asyncio.run(
        generate_and_rm_group(
            FakeEngine(),
            group,
            SAMPLING,
            reward_fn=lambda x: 1.0,
            sink=sink,
            sample_done_callback=done.append,
            generate_function=two_turns(),
        )
    )
    assert len(out) == 2 and all(isinstance(t, list) for t in out)
    assert [[s.index for s in t] for t in out] == [[0, 100], [1, 101]]
    assert out[0][0] is group[0]  # turn 0 generated in place, as the single-turn generate
    assert len(done) == 2  # one scheduler credit per prompt sample (its generate_and_rm task)
    added = [e.fields for e in sink.of(ev.TRAJECTORY_SAMPLE)]
    assert added == [
        {"index": 100, "group_index": 3, "trajectory": 0},
        {"index": 101, "group_index": 3, "trajectory": 1},
    ]
    assert sink.events[-1].kind == ev.GROUP_DONE


def _data_source(n: int) -> RolloutDataSourceWithBuffer:
    return RolloutDataSourceWithBuffer(n, lambda k: (f"p{k}", [0, 0], k))


def test_a_fully_async_drain_takes_nested_groups_by_trajectory_count():
    """B nested groups of n trajectories (4 samples each) make a batch, not B*n samples'
    worth of groups; the flattened batch is 2x the single-turn one."""
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, fully_async=True, num_rollout=2)
    fn = FullyAsyncRolloutFn(
        config, FakeEngine(), _data_source(2), sampling=SAMPLING, reward_fn=lambda s: 1.0, generate_function=two_turns()
    )

    async def main():
        data, metrics = await fn(0, 1)
        fn.worker.cancel()
        await asyncio.gather(fn.worker, return_exceptions=True)
        return data

    data = asyncio.run(main())
    assert len(data) == 2 and all(len(g) == 2 for g in data)
    assert [len(samples_of(g)) for g in data] == [4, 4]
    assert [g[0][0].group_index for g in data] == sorted(g[0][0].group_index for g in data)


def test_a_fully_async_drain_raises_on_a_group_of_the_wrong_top_level_length():
    """The top-level check still fails: a group of n+1 trajectories."""
    config = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=2, fully_async=True)
    fn = FullyAsyncRolloutFn(config, None, None, sampling=SAMPLING)
    bad = [[Sample(index=i, group_index=0)] for i in range(3)]

    class Buffer:
        async def get(self, current_version=None, **context):
            return DataBufferInput(prompt_group=[t[0] for t in bad], group=bad)

        def get_metrics(self):
            return {}

    async def main():
        fn.buffer, fn._worker = Buffer(), asyncio.get_running_loop().create_future()
        await fn._drain(0, 1)

    with pytest.raises(AssertionError, match="3 trajectories, expected 2"):
        asyncio.run(main())


def test_a_one_step_rollout_returns_nested_groups():
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2)
    roll = OneStepRollout(
        config, FakeEngine(), _data_source(2), sampling=SAMPLING, reward_fn=lambda s: 1.0, generate_function=two_turns()
    )
    data, _ = asyncio.run(roll(0, 1))
    assert len(data) == 2 and all(len(g) == 2 and all(len(t) == 2 for t in g) for g in data)
    assert all(s.reward == 1.0 for g in data for s in samples_of(g))


def _buffer(**cfg) -> tuple[DefaultDataBuffer, list]:
    calls: list = []
    args = AsyncConfig(**{"rollout_batch_size": 2, "n_samples_per_prompt": 2, "fully_async": True, **cfg})
    return DefaultDataBuffer(DataBufferConstructorInput(args, lambda pg, cause="": calls.append(cause))), calls


def _nested_entry(later_turn: Sample) -> DataBufferInput:
    prompt = [Sample(index=i, group_index=0, weight_versions=["3"], status=Status.COMPLETED) for i in range(2)]
    return DataBufferInput(prompt_group=prompt, group=[[prompt[0], later_turn], [prompt[1]]])


def test_the_buffer_rejects_a_nested_group_aborted_in_a_later_turn():
    """``fully_async_data_buffer.py:L127``: ABORTED is looked for in every turn (one level)."""
    buf, calls = _buffer()
    asyncio.run(buf.put(_nested_entry(Sample(index=100, group_index=0, weight_versions=["3"], status=Status.ABORTED))))
    assert len(buf) == 0 and calls == ["aborted"]


def test_the_buffer_reads_staleness_from_the_oldest_turn_of_any_trajectory():
    """``fully_async_data_buffer.py:L40-L43``: the minimum over all trajectories and turns."""
    buf, calls = _buffer(max_weight_staleness=2)
    old = Sample(index=100, group_index=0, weight_versions=["1"], status=Status.COMPLETED)

    async def main():
        await buf.put(_nested_entry(old))
        fresh = _nested_entry(Sample(index=101, group_index=1, weight_versions=["3"], status=Status.COMPLETED))
        await buf.put(fresh)
        return await buf.get(current_version=4), buf.get_metrics()

    got, metrics = asyncio.run(main())
    assert got.group[0][1].index == 101  # the first group (staleness 4 - 1 = 3 > 2) was rejected
    assert calls == ["stale"]
    assert metrics["rollout/fully_async/max_staleness"] == 3.0
