"""Generate functions (``--custom-generate-function-path``): a call for one prompt sample
may return several samples, so a group becomes ``n`` trajectories (a nested group).

Mirrors radixark/miles at ``rules.PINNED_MILES_COMMIT``: ``GenerateFnInput`` / ``GenerateFnOutput``
(``rollout/base_types.py:L71-L86``; the input carries the engine instead of a
``GenerateState``) and ``generate_and_rm`` (``inference_rollout_common.py:L58-L134``): a
COMPLETED or TRUNCATED sample is kept as it is (L70-L75); a returned list is left
unrewarded if any of its samples is ABORTED, else each sample without a reward is rewarded
(L117-L125). The group is the calls' results in order (``asyncio.gather``, L168): ``n``
trajectories, checked at the top level (``fully_async_rollout.py:L171``) and flattened one
level wherever samples are read (``types.iter_samples``); training flattens the batch
(``ray/rollout/rollout_data_conversion.py:L24-L26``). ``gen_start`` is the core's side of
upstream's lifecycle seam (``TrajectoryLifecycle().sink.gen_start``, L92-L93): a generate
function announces each sample before its request, and one other than its prompt sample is
recorded as ``trajectory_sample``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from miles_async_core import events as ev
from miles_async_core.types import Sample, SamplingParams, Status


@dataclass(frozen=True)
class GenerateFnInput:
    engine: Any
    sample: Sample
    sampling_params: SamplingParams
    evaluation: bool = False
    sink: Any = None

    def gen_start(self, sample: Sample) -> None:
        if sample is not self.sample and self.sink is not None and self.sink.enabled:
            self.sink.emit(
                ev.TRAJECTORY_SAMPLE, index=sample.index, group_index=sample.group_index, trajectory=self.sample.index
            )


@dataclass(frozen=True)
class GenerateFnOutput:
    samples: Sample | list[Sample]


GenerateFunction = Callable[[GenerateFnInput], Awaitable[GenerateFnOutput]]


async def generate(input: GenerateFnInput) -> GenerateFnOutput:
    """The single-turn generate (``generate_hub/single_turn.py``): one request, in place."""
    await input.engine.generate(input.sample, input.sampling_params)
    return GenerateFnOutput(samples=input.sample)


async def generate_and_rm(
    generate_function: GenerateFunction,
    engine: Any,
    sample: Sample,
    sampling: SamplingParams,
    *,
    reward_fn: Callable[..., Any] | None = None,
    sink: Any = None,
) -> Sample | list[Sample]:
    if sample.status is Status.COMPLETED or sample.status is Status.TRUNCATED:
        return sample
    out = (await generate_function(GenerateFnInput(engine, sample, sampling, sink=sink))).samples
    samples = out if isinstance(out, list) else [out]
    if reward_fn is not None and not any(s.status is Status.ABORTED for s in samples):
        for s in samples:
            if s.reward is None:
                s.reward = reward_fn(s)
    return out
