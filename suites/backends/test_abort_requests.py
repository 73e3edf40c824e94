"""``abort_requests`` on every real engine: SGLang's ``/abort_request`` with
``abort_all``, which upstream's ``abort()`` posts after every one-step rollout
(``inference_rollout_train.py:L24-L33``).

Each engine (``TorchEngine`` on a thread, ``ProcessEngine`` in a child process,
``RayEngineGroup`` over two actors) runs a real one-step rollout (``OneStepRollout``,
over-sampled) on a core that holds after a fixed number of decode steps
(``fixtures/held_engine.py``), and the rollout's end-of-rollout abort waits until the
engine holds: what is in flight then, and each request's partial output, is fixed, not
a matter of timing. The aborted requests come back ABORTED with their partial tokens,
the trace records one abort pause per engine, and every applicable checker holds on it,
conservation included (the test closes the account as a trainer would). An abort with
nothing in flight records nothing at all.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from pathlib import Path

import pytest

from harness.backends.torch_models import TinyLM, TinyLMConfig
from harness.checking.invariants import applicable, check_all, format_violations
from harness.trace import TraceRecorder
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.data_source import RolloutDataSource
from miles_async_core.rollout import OneStepRollout
from miles_async_core.types import SamplingParams, Status

try:
    from fixtures.held_engine import HoldsAfterSteps
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.held_engine import HoldsAfterSteps

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model, pytest.mark.ray]

CFG = TinyLMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32, seed=3)
B, N = 2, 2  # groups per rollout, samples per prompt
HOLD_WAIT_S = 60.0  # a bound on waiting for the engine to hold, so a bug fails instead of hanging


class Recorder:
    """The run's trace (strict), and a way to wait until it holds ``n`` decode steps."""

    enabled = True

    def __init__(self) -> None:
        self.trace = TraceRecorder(time.monotonic, strict=True)  # asyncio's loop.time() is time.monotonic()
        self.decode_steps = 0
        self._stepped = asyncio.Event()

    def emit(self, kind: str, /, **fields) -> None:
        self.trace.emit(kind, **fields)
        if kind == ev.DECODE_STEP:
            self.decode_steps += 1
            self._stepped.set()

    async def wait_for_decode_steps(self, n: int) -> None:
        async def reached() -> None:
            while self.decode_steps < n:
                self._stepped.clear()
                await self._stepped.wait()

        await asyncio.wait_for(reached(), HOLD_WAIT_S)

    def of(self, *kinds: str) -> list:
        return self.trace.of(*kinds)


class AbortsWhenHeld:
    """The engine under test as the rollout sees it: ``abort_requests`` first waits until
    every engine holds (``HoldsAfterSteps.MAX_STEPS`` decode steps each, seen in the
    trace); the samples it was asked to generate are kept for the assertions."""

    def __init__(self, engine, recorder: Recorder, *, engines: int) -> None:
        self.engine, self.recorder, self.engines = engine, recorder, engines
        self.samples = []

    def generate(self, sample, sampling):
        self.samples.append(sample)
        return self.engine.generate(sample, sampling)

    async def abort_requests(self) -> None:
        await self.recorder.wait_for_decode_steps(HoldsAfterSteps.MAX_STEPS * self.engines)
        await self.engine.abort_requests()


def expected_tokens(index: int, *, engines: int, max_new_tokens: int) -> int:
    """Requests go round-robin to the engines (least outstanding, all submitted at once)
    and run one at a time on each (``max_running=1``), so the one at position p on its
    engine has ``MAX_STEPS - p * max_new_tokens`` tokens, clipped to [0, max_new_tokens]."""
    position = index // engines
    return min(max_new_tokens, max(0, HoldsAfterSteps.MAX_STEPS - position * max_new_tokens))


def torch_engine(recorder: Recorder):
    from harness.backends.torch_engine import TorchEngine

    return TorchEngine(HoldsAfterSteps(TinyLM(CFG), max_running=1), seed=5, sink=recorder)


def process_engine(recorder: Recorder):
    from harness.backends.process_engine import ProcessEngine

    return ProcessEngine(
        functools.partial(TinyLM, CFG),
        TinyLM(CFG).weights_copy(),
        max_running=1,
        seed=5,
        sink=recorder,
        max_seq_len=CFG.max_seq_len,
        core_cls=HoldsAfterSteps,
    )


def ray_engines(recorder: Recorder):
    from harness.backends.ray_engine import RayEngineGroup

    return RayEngineGroup(
        functools.partial(TinyLM, CFG),
        num_engines=2,
        max_running=1,
        seed=5,
        sink=recorder,
        max_seq_len=CFG.max_seq_len,
        core_cls=HoldsAfterSteps,
    )


# name -> (factory, engines, max_new_tokens, over-sampled groups): with MAX_STEPS=14 the
# first B groups finish, the next requests hold partial output and the last ones wait
ENGINES = {
    "torch": (torch_engine, 1, 3, 3),
    "process": (process_engine, 1, 3, 3),
    "ray": (ray_engines, 2, 5, 4),
}


async def _rollout_on_held_engine(name: str):
    factory, engines, max_new_tokens, over_sampling = ENGINES[name]
    recorder = Recorder()
    engine = factory(recorder)
    try:
        await engine.abort_requests()  # nothing in flight yet: records nothing, changes nothing
        idle_abort_events = len(recorder.trace.events)
        # the initial weight sync, as the driver does before rollout 0 (which is version 1's)
        await engine.pause_generation("retract")
        await engine.update_weights(1, TinyLM(CFG).weights_copy())
        recorder.emit(ev.ENGINE_VERSION, version=1)
        await engine.continue_generation()
        held = AbortsWhenHeld(engine, recorder, engines=engines)
        # one rollout is the whole run: its account ends with rollout 0 trained
        config = AsyncConfig(
            rollout_batch_size=B, n_samples_per_prompt=N, over_sampling_batch_size=over_sampling, num_rollout=1
        )
        source = RolloutDataSource(N, lambda k: (f"p{k}", [4 + k, 9, 2 + k], None), sink=recorder)
        rollout = OneStepRollout(
            config, held, source, sampling=SamplingParams(max_new_tokens=max_new_tokens), sink=recorder
        )
        data, metrics = await rollout(0, 1)
        events_after_rollout = len(recorder.trace.events)
        await engine.abort_requests()  # nothing left in flight: again nothing
        # (an engine thread's own idle bookkeeping, e.g. its generating phase ending, may still arrive)
        late = [e.kind for e in recorder.trace.events[events_after_rollout:]]
        assert not set(late) & {ev.ENGINE_PAUSE, ev.ENGINE_RESUME, ev.ABORTED, ev.FINISHED}, late
    finally:
        engine.close()
    # the test closes the account as the trainer and the run's end would
    recorder.emit(ev.TRAINED, rollout_id=0, group_indices=[g[0].group_index for g in data], trainer_version=1)
    recorder.emit(ev.RUN_END, pending_groups=[])
    return config, data, metrics, held.samples, recorder, idle_abort_events


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(ENGINES))
def test_abort_requests_ends_every_request_in_flight_with_its_partial_output_and_loses_nothing(request, name):
    if name == "ray":
        request.getfixturevalue("ray_cluster")
    _, engines, max_new_tokens, over_sampling = ENGINES[name]
    config, data, metrics, samples, recorder, idle_abort_events = asyncio.run(_rollout_on_held_engine(name))

    assert idle_abort_events == 0  # an abort with nothing in flight is a no-op
    assert [g[0].group_index for g in data] == list(range(B))
    assert metrics["rollout/dropped_groups/aborted_at_rollout_end"] == over_sampling - B
    assert sorted(s.index for s in samples) == list(range(over_sampling * N))
    lengths = {}
    for s in samples:
        expected = expected_tokens(s.index, engines=engines, max_new_tokens=max_new_tokens)
        lengths[s.index] = len(s.response_tokens)
        assert len(s.response_tokens) == expected, s.index
        assert s.status is (Status.TRUNCATED if expected == max_new_tokens else Status.ABORTED), s.index
        assert len(s.rollout_log_probs) == len(s.token_versions) == expected
        assert s.weight_versions == ["1"] and {v for v, _, _ in s.token_versions.runs} <= {1}
    aborted = sorted(s.index for s in samples if s.status is Status.ABORTED)
    assert any(0 < lengths[i] < max_new_tokens for i in aborted)  # partial output kept
    assert any(lengths[i] == 0 for i in aborted)  # a waiting request aborts too

    # after the sync, one abort pause per engine: engine_pause(abort), the aborted results, engine_resume
    events = recorder.trace.events
    pauses = [i for i, e in enumerate(events) if e.kind == ev.ENGINE_PAUSE]
    assert [events[i]["mode"] for i in pauses] == ["retract"] * engines + ["abort"] * engines
    assert sum(events[i]["in_flight"] for i in pauses[engines:]) == len(aborted)
    resumes = [i for i, e in enumerate(events) if e.kind == ev.ENGINE_RESUME]
    assert len(resumes) == 2 * engines
    finished_aborted = [i for i, e in enumerate(events) if e.kind == ev.FINISHED and e["status"] == "aborted"]
    assert len(finished_aborted) == len(aborted)
    assert pauses[engines] < finished_aborted[0] and finished_aborted[-1] < resumes[-1]

    violations = check_all(recorder.trace.events, config)
    assert violations == [], format_violations(violations)
    names = {c.name for c in applicable(config)}
    assert {"conservation", "abort_semantics", "no_generation_while_paused", "token_versions"} <= names
