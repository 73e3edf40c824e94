"""Driver loops: Miles' version arithmetic and ordering (``train.py``, ``train_async.py``, the
fully-async worker)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from harness.sim.scenario import Scenario
from harness.sim.engine import LengthDist, SimEngineConfig
from harness.sim.trainer import SimTrainerConfig
from harness.sim.run_scenario import simulate
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig


def run(**cfg):
    config = AsyncConfig(**{"rollout_batch_size": 3, "n_samples_per_prompt": 2, "num_rollout": 7, **cfg})
    scenario = Scenario(
        config=config,
        engine=SimEngineConfig(response_length=LengthDist(kind="uniform", low=4, high=40)),
        trainer=SimTrainerConfig(step_base_s=0.5),
        max_new_tokens=64,
    )
    result = simulate(scenario)
    assert result.error is None, result.error
    return result


def generate_versions(result) -> dict[int, int]:
    return {e["rollout_id"]: e["version"] for e in result.events if e.kind == ev.GENERATE_START}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_one_step_generate_version_follows_miles_formula(k):
    result = run(update_weights_interval=k)
    S = 0
    for M, version in generate_versions(result).items():
        updates_before = sum(1 for N in range(S, M - 1) if (N + 1) % k == 0)
        assert version == (1 if M == S else 1 + updates_before)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_update_count_is_one_plus_the_iterations_with_rollout_id_plus_one_divisible_by_k(k):
    result = run(update_weights_interval=k)
    updates = [e for e in result.events if e.kind == ev.ENGINE_VERSION]
    assert len(updates) == 1 + sum(1 for N in range(7) if (N + 1) % k == 0)
    assert [e["version"] for e in updates] == list(range(1, len(updates) + 1))


def test_sync_driver_generates_rollout_m_at_version_m_plus_one_and_ignores_the_interval():
    result = run(driver="train", update_weights_interval=3)
    assert generate_versions(result) == {M: M + 1 for M in range(7)}
    assert all(set(r["lag_steps"]) == {0} for r in result.history)


def test_one_step_launches_the_next_generate_before_training_and_never_updates_during_one():
    result = run()
    generating: set[int] = set()
    launched_before_train: dict[int, bool] = {}
    for e in result.events:
        if e.kind == ev.GENERATE_START:
            generating.add(e["rollout_id"])
        elif e.kind == ev.GENERATE_END:
            generating.discard(e["rollout_id"])
        elif e.kind == ev.TRAINED:
            launched_before_train[e["rollout_id"]] = (e["rollout_id"] + 1) in generating or e["rollout_id"] == 6
        elif e.kind == ev.ENGINE_PAUSE and e["mode"] != "abort":
            assert not generating, f"weight update at t={e.t} while generate {generating} is in flight"
    assert all(launched_before_train.values())


def test_a_trained_sample_in_one_step_mode_carries_a_single_version():
    result = run(update_weights_interval=2)
    for e in result.events:
        if e.kind == ev.FINISHED and e["status"] != "aborted":
            assert len({r[0] for r in e["token_versions"]}) == 1
            assert e["weight_versions"] == [str(e["token_versions"][-1][0])]


def test_fully_async_drain_reads_the_version_once_and_judges_staleness_against_it():
    result = run(fully_async=True, max_weight_staleness=1, async_unused_samples_handler="retry")
    drain_version = {}
    current = None
    for e in result.events:
        if e.kind == ev.DRAIN_START:
            current = e["current_version"]
            drain_version[e["rollout_id"]] = current
        elif e.kind in (ev.GOT, ev.STALE_REJECTED):
            assert e["current_version"] == current
    assert drain_version[0] == 1


def test_fsdp_backend_ignores_the_pause_mode_and_retracts():
    result = run(fully_async=True, pause_generation_mode="in_place", train_backend="fsdp")
    modes = {e["mode"] for e in result.events if e.kind == ev.ENGINE_PAUSE}
    assert modes == {"retract"}


def test_a_dead_worker_fails_the_next_drain_with_its_exception():
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=5, fully_async=True)
    scenario = Scenario(config=config, engine=SimEngineConfig(request_failure_rate=0.2))
    result = simulate(scenario)
    assert result.error is not None and "injected failure" in str(result.error)


def test_a_trainer_exception_stops_the_run_and_is_reported():
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=5, fully_async=True)
    result = simulate(Scenario(config=config, trainer=SimTrainerConfig(fail_at_step=2)))
    assert "injected trainer failure at step 2" in str(result.error)
    assert len(result.history) == 2


def test_a_dead_engine_stops_the_one_step_rollout_instead_of_retrying_forever():
    from miles_async_core.errors import EngineDeadError
    from harness.sim.engine import SimEngine

    class DeadAfter(SimEngine):
        def generate(self, sample, sampling):
            if sample.index >= 8:
                raise EngineDeadError("engine process exited (exit code -9)")
            return super().generate(sample, sampling)

    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=6)
    result = simulate(Scenario(config=config), engine_factory=DeadAfter)
    assert isinstance(result.error, EngineDeadError)
    assert 1 <= len(result.history) < 6


@pytest.mark.parametrize("fully_async", [False, True], ids=["one-step", "fully-async"])
def test_a_dead_engine_leaves_no_failure_unretrieved(fully_async, caplog):
    """Every sibling group that failed with the engine is collected, not left for the
    garbage collector to log ("Task exception was never retrieved") at a random later
    point; on CPython 3.11 that late logging broke an unrelated ``ast.parse`` in CI."""
    from miles_async_core.errors import EngineDeadError
    from harness.sim.engine import SimEngine

    class DeadAfter(SimEngine):
        async def generate(self, sample, sampling):
            if sample.index >= 16:  # every request in flight fails at the same instant
                await asyncio.sleep(1.0)
                raise EngineDeadError("engine process exited (exit code -9)")
            return await super().generate(sample, sampling)

    config = AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=2, num_rollout=6, fully_async=fully_async)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        result = simulate(Scenario(config=config), engine_factory=DeadAfter)
        gc.collect()
    assert isinstance(result.error, EngineDeadError)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_one_step_rollout_that_fails_collects_every_sibling_group(caplog):
    """All four groups fail in the same instant; the rollout raises the first failure and
    must have retrieved the other three, even though the caller keeps the loop running."""
    from miles_async_core.data_source import RolloutDataSource
    from miles_async_core.errors import EngineDeadError
    from miles_async_core.rollout import OneStepRollout
    from miles_async_core.types import SamplingParams

    class DeadEngine:
        async def generate(self, sample, sampling):
            await asyncio.sleep(0)
            raise EngineDeadError("engine process exited (exit code -9)")

    config = AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=2)
    rollout = OneStepRollout(
        config,
        DeadEngine(),
        RolloutDataSource(2, lambda k: (f"p{k}", [k], None)),
        sampling=SamplingParams(max_new_tokens=4),
    )

    async def main():
        with pytest.raises(EngineDeadError):
            await rollout(0, 1)
        for _ in range(10):  # the caller goes on (closes the engine): sibling tasks finish
            await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


class _ScriptedEngine:
    """Sample ``index`` finishes after ``delays[index]`` loop iterations; ``fail`` raises."""

    weight_version = 1

    def __init__(self, delays, fail=(), with_abort_requests=False):
        self.delays, self.fail, self.aborts, self.pauses = delays, set(fail), 0, 0
        if with_abort_requests:
            self.abort_requests = self._abort_requests

    async def generate(self, sample, sampling):
        for _ in range(self.delays.get(sample.index, 0)):
            await asyncio.sleep(0)
        if sample.index in self.fail:
            raise RuntimeError(f"request {sample.index} failed")
        return sample

    async def _abort_requests(self):
        self.aborts += 1

    async def pause_generation(self, mode):
        self.pauses += 1

    async def continue_generation(self):
        pass


def _one_step(engine, B, over_sampling):
    from miles_async_core.data_source import RolloutDataSource
    from miles_async_core.rollout import OneStepRollout
    from miles_async_core.types import SamplingParams

    config = AsyncConfig(rollout_batch_size=B, n_samples_per_prompt=1, over_sampling_batch_size=over_sampling)
    return OneStepRollout(
        config, engine, RolloutDataSource(1, lambda k: (f"p{k}", [k], None)), sampling=SamplingParams(max_new_tokens=4)
    )


def test_a_group_that_fails_during_the_end_of_rollout_abort_fails_the_step(caplog):
    """Upstream's abort() awaits the pending groups with as_completed_async
    (inference_rollout_train.py:L40), so a pending group that raises fails the rollout;
    the groups still pending are left running, as upstream, and their outcomes retrieved."""
    engine = _ScriptedEngine({1: 3, 2: 8}, fail={1})
    rollout = _one_step(engine, B=1, over_sampling=3)
    late: list = []

    async def main():
        with pytest.raises(RuntimeError, match="request 1 failed"):
            await rollout(0, 1)
        late.extend(t for t in asyncio.all_tasks() if t is not asyncio.current_task())
        for _ in range(20):
            await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert len(late) == 1 and late[0].done() and not late[0].cancelled()  # group 2 ran on and finished
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_one_step_rollout_posts_abort_requests_even_with_nothing_pending():
    """Upstream's abort() posts abort_request after every rollout (inference_rollout_train.py:L24-L33);
    an engine with ``abort_requests`` gets it, and without groups pending it is not paused."""
    engine = _ScriptedEngine({}, with_abort_requests=True)
    data, _ = asyncio.run(_one_step(engine, B=2, over_sampling=2)(0, 1))
    assert len(data) == 2 and engine.aborts == 1 and engine.pauses == 0


def test_a_worker_that_dies_after_the_last_drain_is_reported_not_lost(caplog):
    """No drain is left to raise the worker's error, so the run completes; the error is
    still logged and kept on the context."""
    from miles_async_core.errors import EngineDeadError
    from harness.sim.engine import SimEngine

    class DeadLate(SimEngine):
        async def generate(self, sample, sampling):
            if sample.index >= 12:  # beyond the 8 samples the two drains need
                raise EngineDeadError("engine process exited (exit code -9)")
            return await super().generate(sample, sampling)

    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, fully_async=True)
    with caplog.at_level(logging.WARNING, logger="miles_async_core.drivers"):
        result = simulate(Scenario(config=config), engine_factory=DeadLate)
    assert result.error is None and len(result.history) == 2
    assert isinstance(result.ctx.worker_error, EngineDeadError)
    assert [r.getMessage() for r in caplog.records] == [
        "the fully-async rollout worker died after the last drain: "
        "EngineDeadError('engine process exited (exit code -9)')"
    ]


def test_a_worker_error_a_drain_raised_is_not_reported_twice(caplog):
    from miles_async_core.errors import EngineDeadError
    from harness.sim.engine import SimEngine

    class DeadEarly(SimEngine):
        async def generate(self, sample, sampling):
            if sample.index >= 2:
                raise EngineDeadError("engine process exited (exit code -9)")
            return await super().generate(sample, sampling)

    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, fully_async=True)
    with caplog.at_level(logging.WARNING, logger="miles_async_core.drivers"):
        result = simulate(Scenario(config=config), engine_factory=DeadEarly)
    assert isinstance(result.error, EngineDeadError) and result.ctx.worker_error is None
    assert caplog.records == []


def test_one_step_filter_drops_are_reported_as_upstreams_drop_reason_metric():
    """A one-step dynamic-filter drop with a reason is counted under
    ``rollout/dynamic_filter/drop_<reason>`` (`inference_rollout_train.py:L142,L185`); a drop
    without a reason is not."""

    def reject_odd(args, group):
        gi = group[0].group_index
        return None if gi % 4 == 3 else (type("Out", (), {"keep": gi % 2 == 0, "reason": "odd"})())

    def hooks(ctx):
        ctx.rollout_manager.rollout_fn.dynamic_filter = reject_odd

    config = AsyncConfig(rollout_batch_size=3, n_samples_per_prompt=2, num_rollout=3)
    result = simulate(
        Scenario(config=config, trainer=SimTrainerConfig(step_base_s=0.5), max_new_tokens=16), hooks=hooks
    )
    assert result.error is None, result.error
    metrics = [e["metrics"] for e in result.events if e.kind == ev.METRICS]
    dropped = [
        e["group_index"] for e in result.events if e.kind == ev.DROPPED and e["reason"].startswith("dynamic_filter:")
    ]
    assert sum(m.get("rollout/dynamic_filter/drop_odd", 0) for m in metrics) == sum(gi % 4 == 1 for gi in dropped)
    assert any(gi % 4 == 3 for gi in dropped)
    assert not any(
        k.startswith("rollout/dynamic_filter/") and k != "rollout/dynamic_filter/drop_odd" for m in metrics for k in m
    )
    trained = [gi for e in result.events if e.kind == ev.TRAINED for gi in e["group_indices"]]
    assert trained and all(gi % 2 == 0 for gi in trained)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"colocate": True}, "Colocation is not supported"),
        ({"colocate": True, "fully_async": True}, "Colocation is not supported"),
        ({"use_critic": True}, "behavior-policy correction"),
        ({"use_critic": True, "fully_async": True}, "behavior-policy correction"),
    ],
)
def test_the_async_driver_refuses_what_upstream_train_async_asserts(fields, message):
    """``train_async.py:L23-L24`` asserts no colocation and an off-policy
    correction with a critic before anything starts; the core's driver does the same."""
    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, **fields)
    result = simulate(Scenario(config=config, trainer=SimTrainerConfig(step_base_s=0.5), max_new_tokens=8))
    assert isinstance(result.error, AssertionError) and message in str(result.error)
    assert not [e for e in result.events if e.kind in (ev.GENERATE_START, ev.ENGINE_VERSION)]


def test_colocated_async_training_runs_only_with_the_harness_extension():
    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "num_rollout": 3, "fully_async": True, "colocate": True}
    assert AsyncConfig().allow_async_colocate is False
    result = run(**base, allow_async_colocate=True)
    assert len([e for e in result.events if e.kind == ev.TRAINED]) == 3
    assert sum(1 for e in result.events if e.kind == ev.ENGINE_PAUSE) > 3  # generation stops while training
    result = run(
        **{"rollout_batch_size": 2, "n_samples_per_prompt": 2, "num_rollout": 3, "driver": "train", "colocate": True}
    )  # train.py allows --colocate upstream too
    assert len([e for e in result.events if e.kind == ev.TRAINED]) == 3


def test_a_drain_checks_a_nested_group_at_the_top_level():
    """``fully_async_rollout.py:L171`` asserts ``len(entry.group) == n``: a
    nested group of n trajectories of two turns each is accepted (8 samples for n=2 and B=2)."""
    from miles_async_core.fully_async import FullyAsyncRolloutFn
    from miles_async_core.types import DataBufferInput, Sample, SamplingParams

    def nested(gi):
        prompt = [Sample(index=gi * 10 + i, group_index=gi, weight_versions=["1"]) for i in range(2)]
        group = [
            [p, Sample(index=gi * 10 + 5 + i, group_index=gi, weight_versions=["1"])] for i, p in enumerate(prompt)
        ]
        return DataBufferInput(prompt_group=prompt, group=group)

    class Buffer:
        def __init__(self):
            self.entries = [nested(1), nested(0)]

        async def get(self, current_version=None, **context):
            return self.entries.pop(0)

        def get_metrics(self):
            return {}

    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, fully_async=True)
    fn = FullyAsyncRolloutFn(config, None, None, sampling=SamplingParams(max_new_tokens=4))

    async def main():
        fn.buffer, fn._worker = Buffer(), asyncio.get_running_loop().create_future()
        data, _ = await fn._drain(0, 1)
        return data

    data = asyncio.run(main())
    assert [g[0][0].group_index for g in data] == [0, 1] and all(len(g) == 2 for g in data)


def test_a_failing_step_leaves_the_launched_generate_running_as_upstream():
    """``train_async.py:L80`` launches generate(N+1) before training step N;
    when that step raises, the launched generate is left running (the core keeps it on
    ``ctx.pending_generate``), not cancelled: it has already pulled its prompts."""
    seen = {}

    def hooks(ctx):
        seen["ctx"] = ctx

    config = AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=5)
    result = simulate(Scenario(config=config, trainer=SimTrainerConfig(fail_at_step=2)), hooks=hooks)
    assert "injected trainer failure at step 2" in str(result.error)
    pending = seen["ctx"].pending_generate
    assert pending is not None and pending.cancelled()  # by the simulation's end, not by the driver
    starts = [e["rollout_id"] for e in result.events if e.kind == ev.GENERATE_START]
    assert starts == [0, 1, 2, 3]
    taken_calls = {e["call"] for e in result.events if e.kind == ev.TAKEN}
    assert len(taken_calls) == 4  # generate(3) pulled its batch before the run ended


@pytest.mark.parametrize("cancel", [False, True])
def test_a_dead_fully_async_workers_sibling_groups_run_on_unless_cancel_orphaned_tasks(caplog, cancel):
    """When a group kills the worker, upstream leaves the sibling group tasks
    running (fully_async_rollout.py:L128-L136), and so does the core, reading each outcome
    so nothing is logged from a finalizer; the harness extension cancel_orphaned_tasks
    cancels them at once."""
    from harness.sim.engine import SimEngine

    class FailOne(SimEngine):
        async def generate(self, sample, sampling):
            out = await super().generate(sample, sampling)
            if sample.index == 12:
                raise RuntimeError("request 12 failed")
            return out

    config = AsyncConfig(
        rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, fully_async=True, cancel_orphaned_tasks=cancel
    )
    scenario = Scenario(config=config, trainer=SimTrainerConfig(step_base_s=5.0))
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        result = simulate(scenario, engine_factory=FailOne)
        gc.collect()
    assert result.error is None and isinstance(result.ctx.worker_error, RuntimeError)
    death = next(e.t for e in result.events if e.kind == ev.GROUP_DONE and e["group_index"] == 6)
    later = [e["group_index"] for e in result.events if e.kind == ev.GROUP_DONE and e["ok"] and e.t > death]
    assert (later == []) == cancel, later
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_drain_after_the_worker_was_cancelled_raises_cancelled_error():
    """Upstream's drain calls self._worker.result() (fully_async_rollout.py:L152): for a
    cancelled worker that raises CancelledError (the core raised WorkerDiedError)."""
    from miles_async_core.data_source import RolloutDataSource
    from miles_async_core.fully_async import FullyAsyncRolloutFn
    from miles_async_core.types import SamplingParams

    config = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, fully_async=True)
    fn = FullyAsyncRolloutFn(
        config,
        _ScriptedEngine({i: 50 for i in range(100)}),
        RolloutDataSource(1, lambda k: (f"p{k}", [k], None)),
        sampling=SamplingParams(max_new_tokens=4),
    )

    async def main():
        drain = asyncio.ensure_future(fn(0, 1))
        for _ in range(3):
            await asyncio.sleep(0)
        fn.worker.cancel()
        try:
            await drain
        except asyncio.CancelledError as exc:
            return exc
        finally:
            await asyncio.gather(
                *(t for t in asyncio.all_tasks() if t is not asyncio.current_task()), return_exceptions=True
            )

    assert isinstance(asyncio.run(main()), asyncio.CancelledError)


def test_the_fully_async_worker_takes_exactly_one_group_per_pull():
    """Upstream unpacks `[prompt_group] = samples` (fully_async_rollout.py:L115): a data
    source that hands out two groups for get_samples(1) kills the worker (ValueError);
    the core took the first and lost the other."""
    from miles_async_core.data_source import RolloutDataSource
    from miles_async_core.fully_async import FullyAsyncRolloutFn
    from miles_async_core.types import SamplingParams

    class TwoAtATime(RolloutDataSource):
        def get_samples(self, num_samples):
            return super().get_samples(num_samples + 1)

    config = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, fully_async=True)
    fn = FullyAsyncRolloutFn(
        config,
        _ScriptedEngine({}),
        TwoAtATime(1, lambda k: (f"p{k}", [k], None)),
        sampling=SamplingParams(max_new_tokens=4),
    )
    with pytest.raises(ValueError, match="too many values to unpack"):
        asyncio.run(fn(0, 1))


def test_a_sample_wake_up_carries_the_group_its_sample_finished():
    """Upstream's per-sample credit reaches the worker through an Event, the task waiting on
    it and asyncio.wait (submission_scheduler.py:L57-L63), so the group whose last sample
    finished is in the same done set: the wake-up on a sample must not return an empty done
    (which would submit a replacement before putting the group)."""
    from miles_async_core.rollout import submit_group
    from miles_async_core.scheduler import Progress, SampleBackfillSubmission
    from miles_async_core.types import Sample, SamplingParams

    async def main():
        scheduler = SampleBackfillSubmission(2)
        progress, active = Progress(scheduler), set()
        group = [Sample(index=0, group_index=0), Sample(index=1, group_index=0)]
        task = submit_group(
            _ScriptedEngine({0: 2, 1: 2}),
            group,
            SamplingParams(max_new_tokens=4),
            scheduler=scheduler,
            progress=progress,
            active=active,
            reward_fn=None,
            sink=None,
        )
        assert not scheduler.has_capacity(pending_groups=1, group_budget=1)  # arms the sample wake-up
        done, pending = await progress.wait_for_progress(active)
        return done == {task}, pending

    assert asyncio.run(main()) == (True, set())


def test_a_group_that_ends_in_the_step_the_waiter_resumes_is_in_its_done_set():
    """asyncio.wait collects every task done when its waiter resumes (``f.done()``, not its
    completion callbacks), so a group that ends one loop step after the group that woke the
    waiter, before the waiter runs, is in the same done set, not one wake-up later (a
    completion queue fed only by done-callbacks would miss it). Its late callback then wakes
    nothing: the next wait returns only on the next group."""
    from miles_async_core.scheduler import GroupLevelSubmission, Progress

    async def main():
        progress, active = Progress(GroupLevelSubmission()), set()
        gate = asyncio.get_running_loop().create_future()

        async def body(extra_hops: int) -> None:
            try:
                await gate
                for _ in range(extra_hops):
                    await asyncio.sleep(0)
            finally:
                progress.ended(asyncio.current_task())

        # a ends first and its done-callback wakes the waiter; b ends one step later, in the
        # step whose callbacks resume the waiter, so before the waiter runs but before b's own
        # done-callback has run
        a, b, c = (asyncio.ensure_future(body(h)) for h in (0, 1, 50))
        for t in (a, b, c):
            progress.track(t)
            active.add(t)
        await asyncio.sleep(0)  # every body is waiting on the gate
        gate.set_result(None)
        first, _ = await progress.wait_for_progress(active)
        second, pending = await progress.wait_for_progress(active)
        return first == {a, b}, second == {c}, pending

    assert asyncio.run(main()) == (True, True, set())


def test_a_resumed_partial_group_generates_only_its_unfinished_samples():
    """A --partial-rollout group comes back with finished and aborted samples;
    upstream's generate_and_rm returns a finished one as it is, reward and all
    (inference_rollout_common.py:L70-L75), the single-turn generate resumes an aborted one
    and truncates one with no token budget left without a request (single_turn.py:L26-L33),
    and only a sample without a reward is rewarded (:L130)."""
    from miles_async_core.rollout import generate_and_rm_group
    from miles_async_core.types import Sample, SamplingParams, Status

    class Recording(_ScriptedEngine):
        def __init__(self):
            super().__init__({})
            self.generated = []

        async def generate(self, sample, sampling):
            self.generated.append(sample.index)
            sample.response_tokens += [7]
            sample.status = Status.COMPLETED
            return sample

    done = Sample(index=0, group_index=0, response_tokens=[1, 2], status=Status.COMPLETED, reward=0.25)
    partial = Sample(index=1, group_index=0, response_tokens=[3], status=Status.ABORTED)
    spent = Sample(index=2, group_index=0, response_tokens=[4, 5, 6, 7], status=Status.ABORTED)
    engine = Recording()
    group = asyncio.run(
        generate_and_rm_group(engine, [done, partial, spent], SamplingParams(max_new_tokens=4), reward_fn=lambda s: 1.0)
    )
    assert engine.generated == [1]
    assert [s.status for s in group] == [Status.COMPLETED, Status.COMPLETED, Status.TRUNCATED]
    assert [s.response_tokens for s in group] == [[1, 2], [3, 7], [4, 5, 6, 7]]
    assert [s.reward for s in group] == [0.25, 1.0, 1.0]


@pytest.mark.parametrize("partial_rollout", [False, True])
def test_one_step_hands_its_pending_groups_back_only_with_partial_rollout(partial_rollout):
    """Upstream's abort() collects the pending groups after abort_request and,
    with --partial-rollout, the rollout function adds them back to the data source, each
    sample with a response marked with the rollout it started in
    (inference_rollout_train.py:L40-L53, inference_rollout_common.py:L225); without it they
    are dropped. The next get_samples hands them out before fresh prompts."""
    from miles_async_core.data_source import RolloutDataSourceWithBuffer
    from miles_async_core.rollout import OneStepRollout
    from miles_async_core.types import SamplingParams, Status

    class Aborting(_ScriptedEngine):
        """Samples 0 and 1 finish at once; the others run until abort_requests aborts them
        with one token."""

        def __init__(self):
            super().__init__({}, with_abort_requests=True)
            self.held = []

        async def generate(self, sample, sampling):
            if sample.index < 2:
                sample.status = Status.COMPLETED
                return sample
            fut = asyncio.get_running_loop().create_future()
            self.held.append((sample, fut))
            return await fut

        async def _abort_requests(self):
            for sample, fut in self.held:
                sample.response_tokens.append(9)
                sample.weight_versions.append("1")
                sample.status = Status.ABORTED
                fut.set_result(sample)
            self.held = []

    config = AsyncConfig(
        rollout_batch_size=2, n_samples_per_prompt=1, over_sampling_batch_size=4, partial_rollout=partial_rollout
    )
    source = RolloutDataSourceWithBuffer(1, lambda k: (f"p{k}", [k], None))
    rollout = OneStepRollout(config, Aborting(), source, sampling=SamplingParams(max_new_tokens=4))
    data, metrics = asyncio.run(rollout(3, 1))
    assert [g[0].index for g in data] == [0, 1]
    if partial_rollout:
        assert [[s.index for s in g] for g in source.buffer] == [[2], [3]]
        assert all(g[0].metadata == {"start_rollout_id": 3} and g[0].response_tokens == [9] for g in source.buffer)
        assert metrics["rollout/dropped_groups/aborted_at_rollout_end"] == 0
        assert [g[0].index for g in source.get_samples(3)] == [2, 3, 4]
    else:
        assert not source.buffer
        assert metrics["rollout/dropped_groups/aborted_at_rollout_end"] == 2
