"""Whole driver runs drawn by hypothesis satisfy every applicable trace invariant.

Configurations span both drivers, one-step and fully-async, B 1..8, n 1..4, k 1..4,
``--max-weight-staleness`` None/0..3, drop/retry, concurrency caps, pause modes, valid
colocation (``manual`` profile), granularity, response-length distributions and fault
schedules (`harness/checking/strategies.py`). On failure every violation is printed as a
timeline. Differential checks: sync and one-step consume the same prompt groups when
nothing is dropped; the simulated engine's timing equals a direct model of its schedule.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.types import Sample, SamplingParams
from harness.sim.faults import FaultSchedule, WorkerCrash, run_with_faults
from harness.checking.invariants import format_violations
from harness.checking.strategies import RunCase, engines, property_settings, run_case, run_cases, violations
from harness.sim.scenario import Scenario
from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.trainer import SimTrainerConfig
from harness.sim.vtime import run_virtual


def assert_no_violations(case: RunCase) -> None:
    outcome = run_case(case)
    found = violations(outcome, case)
    assert not found, f"{case.describe()}\n\n{format_violations(found)}"


@pytest.mark.slow
@property_settings(200)
@given(run_cases())
def test_fault_free_runs_satisfy_every_invariant(case: RunCase) -> None:
    assert_no_violations(case)


@pytest.mark.slow
@property_settings(100)
@given(run_cases(fully_async=True))
def test_fully_async_runs_satisfy_every_invariant(case: RunCase) -> None:
    assert_no_violations(case)


@pytest.mark.slow
@property_settings(200)
@given(run_cases(faults=True))
def test_runs_with_faults_end_cleanly_and_their_traces_hold_on_the_prefix(case: RunCase) -> None:
    outcome = run_case(case)
    assert outcome.clean, f"{case.describe()}\nunexpected error {outcome.error!r}"
    found = violations(outcome, case)
    assert not found, f"{case.describe()}\n\n{format_violations(found)}"


# --- each fault schedule really injects its fault -------------------------------------------------

FA = AsyncConfig(
    rollout_batch_size=4,
    n_samples_per_prompt=2,
    fully_async=True,
    num_rollout=5,
    async_unused_samples_handler="retry",
    max_weight_staleness=1,
)
ONE_STEP = AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=2, num_rollout=5)


def _scenario(config: AsyncConfig) -> Scenario:
    return Scenario(
        config=config,
        engine=SimEngineConfig(response_length=LengthDist(kind="uniform", low=4, high=40)),
        trainer=SimTrainerConfig(step_base_s=0.5),
        max_new_tokens=32,
    )


def _kinds(outcome, kind: str, **match: object) -> list:
    return [e for e in outcome.events if e.kind == kind and all(e.get(k) == v for k, v in match.items())]


def test_injected_aborts_reach_the_buffer_as_aborted_rejects_and_the_handler() -> None:
    case = RunCase(_scenario(FA), FaultSchedule(injected_abort_rate=0.3, seed=1))
    outcome = run_case(case)
    assert outcome.error is None and len(outcome.history) == FA.num_rollout
    assert _kinds(outcome, ev.PUT_REJECTED, reason="aborted")
    assert _kinds(outcome, ev.HANDLER, cause="aborted")
    assert not violations(outcome, case)


def test_abort_storms_abort_running_requests_in_one_step_mode() -> None:
    case = RunCase(_scenario(ONE_STEP), FaultSchedule(abort_storm_times_s=(0.1, 0.9, 1.7)))
    outcome = run_case(case)
    assert _kinds(outcome, ev.FAULT, what="abort_storm") and _kinds(outcome, ev.FINISHED, status="aborted")
    assert outcome.error is None and not violations(outcome, case)


def test_a_trainer_failure_ends_the_run_with_that_error_and_a_consistent_prefix() -> None:
    case = RunCase(_scenario(FA), FaultSchedule(trainer_fail_at_step=2))
    outcome = run_case(case)
    assert type(outcome.error).__name__ == "TrainerStepError" and len(outcome.history) == 2
    assert not violations(outcome, case)


def test_a_worker_crash_fails_the_next_drain() -> None:
    case = RunCase(_scenario(FA), FaultSchedule(worker_crash_after_requests=30))
    outcome = run_case(case)
    assert isinstance(outcome.error, WorkerCrash) and _kinds(outcome, ev.FAULT, what="worker_crash")
    assert not violations(outcome, case)


@given(st.floats(0.0, 4.0).map(lambda t: round(t, 3)), st.sampled_from([FA, ONE_STEP]))
@property_settings(30)
def test_cancellation_at_any_time_ends_with_cancelled_error_and_a_consistent_trace(
    t: float, config: AsyncConfig
) -> None:
    case = RunCase(_scenario(config), FaultSchedule(cancel_at_s=t))
    outcome = run_case(case)
    assert outcome.cancelled or outcome.error is None
    assert _kinds(outcome, ev.RUN_END)  # tasks cancelled at teardown may still log after it
    found = violations(outcome, case)
    assert not found, format_violations(found)


def test_a_dynamic_filter_rejects_groups_without_the_handler() -> None:
    case = RunCase(_scenario(FA), FaultSchedule(dynamic_filter_reject_rate=0.3, seed=2))
    outcome = run_case(case)
    assert _kinds(outcome, ev.PUT_REJECTED, reason="dynamic_filter:fault")
    assert outcome.error is None and not violations(outcome, case)
    assert any("rollout/dynamic_filter/drop_fault" in r for r in outcome.history)


def test_worker_crash_is_refused_outside_fully_async() -> None:
    import pytest

    from miles_async_core.errors import ConfigError

    with pytest.raises(ConfigError, match="worker_crash_after_requests"):
        run_with_faults(_scenario(ONE_STEP), FaultSchedule(worker_crash_after_requests=3))


# --- differential checks -----------------------------------------------------------------------


def _trained(outcome) -> list[list[int]]:
    return [list(e["group_indices"]) for e in outcome.events if e.kind == ev.TRAINED]


@property_settings(60)
@given(
    b=st.integers(1, 8),
    n=st.integers(1, 4),
    num=st.integers(3, 8),
    engine=engines(),
    step_s=st.sampled_from([0.02, 0.5, 2.0]),
    granularity=st.sampled_from([None, "group"]),
)
def test_sync_and_one_step_consume_the_same_prompt_groups_when_nothing_is_dropped(
    b, n, num, engine, step_s, granularity
) -> None:
    outs = []
    for driver in ("train", "train_async"):
        cfg = AsyncConfig(
            driver=driver,
            rollout_batch_size=b,
            n_samples_per_prompt=n,
            num_rollout=num,
            rollout_submission_granularity=granularity,
        )
        sc = Scenario(config=cfg, engine=engine, trainer=SimTrainerConfig(step_base_s=step_s), max_new_tokens=64)
        outs.append(run_case(RunCase(sc, FaultSchedule())))
    assume(not any(_kinds(o, ev.DROPPED) for o in outs))
    sync, one_step = outs
    assert sync.error is None and one_step.error is None
    assert _trained(sync) == _trained(one_step)
    assert sync.result.ctx.trainer.consumed == one_step.result.ctx.trainer.consumed


def _finish_times(cfg: SimEngineConfig, max_new: list[int]) -> list[float]:
    async def main() -> list[float]:
        engine = SimEngine(cfg)
        loop = asyncio.get_running_loop()
        times: list[float] = [0.0] * len(max_new)

        async def one(i: int, m: int) -> None:
            await engine.generate(
                Sample(index=i, group_index=i, prompt_tokens=[0] * cfg.prompt_tokens), SamplingParams(max_new_tokens=m)
            )
            times[i] = loop.time()

        await asyncio.gather(*(one(i, m) for i, m in enumerate(max_new)))
        return times

    return run_virtual(main())


LONG = LengthDist(kind="fixed", median=10_000)


@property_settings(50)
@given(
    length=st.integers(1, 200),
    prompt=st.integers(1, 256),
    base=st.sampled_from([0.001, 0.02, 0.05]),
    per_seq=st.sampled_from([0.0, 0.0002, 0.003]),
    prefill=st.sampled_from([0.0, 0.00002, 0.001]),
)
def test_one_request_alone_finishes_after_prefill_plus_length_steps(length, prompt, base, per_seq, prefill) -> None:
    cfg = SimEngineConfig(
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        prefill_per_token_s=prefill,
        prompt_tokens=prompt,
        response_length=LONG,
    )
    (t,) = _finish_times(cfg, [length])
    assert abs(t - (prompt * prefill + length * (base + per_seq))) < 1e-9


@property_settings(50)
@given(
    l1=st.integers(1, 100),
    extra=st.integers(0, 100),
    prompt=st.integers(1, 64),
    base=st.sampled_from([0.001, 0.02]),
    per_seq=st.sampled_from([0.0, 0.0002, 0.003]),
)
def test_two_requests_share_steps_until_the_shorter_one_finishes(l1, extra, prompt, base, per_seq) -> None:
    l2, prefill = l1 + extra, 0.00002
    cfg = SimEngineConfig(
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        prefill_per_token_s=prefill,
        prompt_tokens=prompt,
        response_length=LONG,
    )
    t1, t2 = _finish_times(cfg, [l1, l2])
    first = 2 * prompt * prefill + l1 * (base + 2 * per_seq)
    assert abs(t1 - first) < 1e-9
    assert abs(t2 - (first + extra * (base + per_seq))) < 1e-9
