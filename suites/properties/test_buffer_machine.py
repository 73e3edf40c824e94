"""The buffer conformance suite (``harness.checking.buffer_machine``) and checks that it can fail.

``test_buffer_keeps_every_guarantee_under_random_interleavings`` runs the shadow-model
machine of ``harness.checking.buffer_machine`` against the buffer named by ``--data-buffer``
(default ``DefaultDataBuffer``); the profile picked by ``HYPOTHESIS_PROFILE`` sets the
number of examples (``ci``: 200, derandomized). The other tests pin the machine itself:
it reaches the interesting states, it names the invariant a wrong buffer breaks, and a
printed reproduction blob replays the identical failure.
"""

from __future__ import annotations

import asyncio
import collections

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.stateful import run_state_machine_as_test

import pytest
from harness.checking.buffer_machine import (
    BufferMachine,
    check_buffer,
    default_settings,
    machine_for,
    replay_buffer_failure,
)
from miles_async_core.buffer import DefaultDataBuffer, call_dynamic_filter
from miles_async_core.staleness import group_oldest_weight_version
from miles_async_core.types import DataBufferInput, Sample, Status, iter_samples

NO_EXPLAIN = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]


@pytest.mark.slow
def test_buffer_keeps_every_guarantee_under_random_interleavings(data_buffer_factory):
    run_state_machine_as_test(
        machine_for(data_buffer_factory),
        settings=settings(
            deadline=None, report_multiple_bugs=False, phases=NO_EXPLAIN, suppress_health_check=[HealthCheck.too_slow]
        ),
    )


# ---- the machine reaches what it is meant to check ------------------------------------------


@pytest.mark.slow
def test_machine_reaches_blocked_puts_stale_rejects_cancellations_and_every_put_kind():
    seen: collections.Counter = collections.Counter()

    class Counting(machine_for(DefaultDataBuffer)):  # type: ignore[misc]
        def teardown(self) -> None:
            seen.update({k: v for k, v in self.totals.items()})
            seen["examples"] += 1
            seen["blocked_put_seen"] += any("cancel blocked put" in line for line in self.log)
            seen["blocked_get_cancelled"] += any("cancel blocked get" in line for line in self.log)
            seen["metrics_checked"] += any("get_metrics()" in line for line in self.log)
            seen["nested"] += any("nested" in line for line in self.log)
            super().teardown()

    run_state_machine_as_test(Counting, settings=settings(default_settings(60), derandomize=True))
    for key in (
        "got",
        "aborted",
        "filtered",
        "stale",
        "cancelled",
        "blocked_put_seen",
        "blocked_get_cancelled",
        "metrics_checked",
        "nested",
    ):
        assert seen[key] > 0, f"the machine never reached {key!r} in {seen['examples']} examples: {dict(seen)}"


@given(st.from_type(DataBufferInput), st.integers(0, 30))
def test_registered_strategies_build_inputs_whose_oracle_staleness_matches_the_core(entry, version):
    # The machine's oracle (harness.checking.buffer_machine._oldest) is written independently of
    # miles_async_core.staleness; they must agree on every registered input.
    from harness.checking.buffer_machine import oracle_oldest_version

    flat = list(iter_samples(entry.group))
    assert oracle_oldest_version(flat) == group_oldest_weight_version(entry.group)
    heads = [t[0] if isinstance(t, list) else t for t in entry.group]  # one trajectory each
    assert [s.index for s in entry.prompt_group] == [s.index for s in heads]
    assert all(isinstance(s, Sample) for s in entry.prompt_group)


@given(st.from_type(Sample))
def test_registered_sample_strategy_gives_samples_miles_can_age(sample):
    numeric = [int(v) for v in sample.weight_versions if v.isdigit()]
    assert sample.oldest_weight_version == (min(numeric) if numeric else None)


# ---- wrong buffers: the machine names what they break ----------------------------------------


class PutNeverBlocks(DefaultDataBuffer):
    async def put(self, input):
        if any(s.status == Status.ABORTED for s in iter_samples(input.group)):
            self._aborted += 1
            self.unused_handler_fn(input.prompt_group, cause="aborted")
            return
        keep, reason = call_dynamic_filter(self.dynamic_filter, self.args, input.group)
        if keep:
            async with self._cond:
                self._buffer.append(input)  # no wait while full
                self._cond.notify_all()
        elif reason:
            self._filter_drops[reason] = self._filter_drops.get(reason, 0) + 1


class GetsNewestFirst(DefaultDataBuffer):
    async def get(self, current_version=None, **context):
        self._buffer.reverse()
        try:
            return await super().get(current_version, **context)
        finally:
            self._buffer.reverse()


class HandsFilterRejectsToHandler(DefaultDataBuffer):
    async def put(self, input):
        keep, _ = call_dynamic_filter(self.dynamic_filter, self.args, input.group)
        if not keep and not any(s.status == Status.ABORTED for s in iter_samples(input.group)):
            self.unused_handler_fn(input.prompt_group)
        await super().put(input)


class MetricsNeverReset(DefaultDataBuffer):
    def get_metrics(self):
        aborted, stale = self._aborted, self._stale
        out = super().get_metrics()
        self._aborted, self._stale = aborted, stale
        return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory, invariant",
    [
        (PutNeverBlocks, "capacity"),
        (GetsNewestFirst, "fifo"),
        (HandsFilterRejectsToHandler, "filter_not_handled"),
        (MetricsNeverReset, "metrics_window"),
    ],
)
def test_check_buffer_names_the_invariant_a_wrong_buffer_breaks(factory, invariant):
    failure = check_buffer(factory, max_examples=200, seed=0)
    assert failure is not None, f"{factory.__name__} passed the conformance machine"
    assert failure.invariant == invariant, str(failure)
    assert "state = BufferMachine()" in failure.steps_text
    assert "state.init_buffer(" in failure.steps_text
    assert failure.timeline.splitlines()[0].strip().startswith("1 buffer built: capacity=")
    assert f"!! {invariant}:" in failure.timeline


@pytest.mark.slow
def test_default_buffer_conforms_through_check_buffer():
    assert check_buffer(DefaultDataBuffer, max_examples=100, seed=1) is None


@pytest.mark.slow
def test_print_blob_replays_the_identical_failure_of_a_wrong_buffer():
    first = check_buffer(GetsNewestFirst, max_examples=200, seed=0)
    assert first is not None and first.reproduce_blob is not None
    version, blob = first.reproduce_blob
    assert isinstance(blob, bytes) and version
    replayed = replay_buffer_failure(GetsNewestFirst, first)
    assert replayed is not None
    assert (replayed.invariant, replayed.message, replayed.timeline) == (first.invariant, first.message, first.timeline)
    assert replayed.steps_text == first.steps_text


@pytest.mark.slow
def test_same_seed_gives_the_same_shrunk_sequence_twice():
    a = check_buffer(PutNeverBlocks, max_examples=100, seed=3)
    b = check_buffer(PutNeverBlocks, max_examples=100, seed=3)
    assert a is not None and b is not None
    assert (a.invariant, a.steps_text, a.timeline) == (b.invariant, b.steps_text, b.timeline)


def test_a_buffer_that_raises_is_reported_as_no_exception_with_its_traceback():
    class Raises(DefaultDataBuffer):
        async def get(self, current_version=None, **context):
            raise RuntimeError("boom in get")

    failure = check_buffer(Raises, max_examples=50)
    assert failure is not None and failure.invariant == "no_exception"
    assert "RuntimeError: boom in get" in failure.message


def test_machine_without_a_factory_refuses_to_run():
    with pytest.raises(AssertionError, match="needs a factory"):
        run_state_machine_as_test(BufferMachine, settings=default_settings(1))


def test_buffer_built_inside_the_machine_loop_may_need_a_running_loop():
    # A factory that creates loop-bound primitives eagerly still works: the machine
    # constructs the buffer inside its own VirtualTimeLoop.
    def factory(ci):
        asyncio.get_running_loop()
        return DefaultDataBuffer(ci)

    assert check_buffer(factory, max_examples=20) is None
