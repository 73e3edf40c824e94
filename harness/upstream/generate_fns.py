"""A multi-sample generate function for the differential (nested groups, the
``nested-groups`` divergence of ``docs/upstream.md``),
in the core's form and in upstream's (``--custom-generate-function-path``).

Upstream's hook: ``GenerateState`` loads ``--custom-generate-function-path`` with
``load_generate_function`` (``inference_rollout_common.py:L50``,
``inference_rollout/compatibility.py:L68-L84``); ``generate_and_rm`` calls it per prompt
sample and takes its ``GenerateFnOutput.samples``, a ``Sample`` or a ``list[Sample]``
(``base_types.py:L82-L86``; upstream's own test ``test_multi_sample.py`` returns a list).
The runner passes ``multi_sample_upstream``'s dotted path, so upstream loads and calls it
through that hook, unmodified.

Both forms make the same trajectory of a prompt sample with index ``i``: ``turns(i)`` =
``1 + i % 3`` samples, generated one after another, each one engine request for the
prompt (a multi-turn agent that keeps one sample per turn). Turn 0 is the prompt sample
itself, generated in place (as the single-turn generate does, so the resubmittable prompt
group and the trained group share it); turn ``j >= 1`` is a copy of the prompt sample as
it was when the call began, with index ``i + j * TURN_INDEX_STRIDE``, so every sample
keeps its own identity in the trace (upstream leaves the indices of added samples to the
generate function: ``agentic_tool_call.py:L119`` "FIXME: handle sample index issues").
A copy carries the prompt sample's retry count (the simulator draws its response from
index and retry). Each sample is announced before its request through the lifecycle
seam (upstream: ``TrajectoryLifecycle().sink.gen_start``, as ``generate_and_rm`` does for
the prompt sample; core: ``GenerateFnInput.gen_start``). The trajectory stops at an
ABORTED turn (``multi_turn.py:L70-L71`` stops on ``abort``), so an aborted trajectory
ends with its aborted sample and the group is rejected by ``put`` as a whole.
"""

from __future__ import annotations

import copy
from typing import Any

TURN_INDEX_STRIDE = 1 << 20


def turns(index: int) -> int:
    """How many samples the trajectory of prompt sample ``index`` returns."""
    return 1 + index % 3


def _added(template: Any, trajectory: int, turn: int) -> Any:
    s = copy.deepcopy(template)
    s.index = trajectory + turn * TURN_INDEX_STRIDE
    return s


async def multi_sample(input: Any) -> Any:
    """The core's form (``miles_async_core.generate.GenerateFunction``)."""
    from miles_async_core.generate import GenerateFnInput, GenerateFnOutput, generate
    from miles_async_core.types import Status

    parent = input.sample
    template = copy.deepcopy(parent)
    samples = []
    for turn in range(turns(parent.index)):
        s = parent if turn == 0 else _added(template, parent.index, turn)
        input.gen_start(s)
        out = await generate(
            GenerateFnInput(
                engine=input.engine,
                sample=s,
                sampling_params=input.sampling_params,
                evaluation=input.evaluation,
                sink=input.sink,
            )
        )
        samples.append(out.samples)
        if out.samples.status is Status.ABORTED:
            break
    return GenerateFnOutput(samples=samples)


async def multi_sample_upstream(input: Any) -> Any:
    """Upstream's form (``--custom-generate-function-path
    harness.upstream.generate_fns.multi_sample_upstream``): each turn is upstream's own
    single-turn ``generate`` (``generate_hub/single_turn.py``)."""
    from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
    from miles.rollout.generate_hub.single_turn import generate
    from miles.utils.lifecycle import TrajectoryLifecycle
    from miles.utils.types import Sample

    parent = input.sample
    template = copy.deepcopy(parent)
    samples = []
    for turn in range(turns(parent.index)):
        s = parent if turn == 0 else _added(template, parent.index, turn)
        # siblings of one compact rollout share its rollout_id, which upstream's manager
        # checks before training (rollout_data_conversion.py:L53-L70)
        if hasattr(s, "rollout_id"):
            s.rollout_id = parent.index
        sink = None if input.evaluation else TrajectoryLifecycle().sink
        if sink is not None:
            sink.gen_start(s)
        out = await generate(
            GenerateFnInput(
                state=input.state,
                sample=s,
                sampling_params=copy.deepcopy(input.sampling_params),
                evaluation=input.evaluation,
            )
        )
        samples.append(out.samples)
        if out.samples.status == Sample.Status.ABORTED:
            break
    return GenerateFnOutput(samples=samples)


# name -> (core form, upstream --custom-generate-function-path)
FORMS = {"multi_sample": (multi_sample, "harness.upstream.generate_fns.multi_sample_upstream")}
