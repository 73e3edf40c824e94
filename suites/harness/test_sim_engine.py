"""SimEngine against a direct model of its schedule, and its pause-mode semantics."""

from __future__ import annotations

import asyncio

import pytest

from harness.sim.draws import uniform
from harness.sim.engine import LengthDist, SimEngine, SimEngineConfig
from harness.sim.vtime import VirtualDeadlock, run_virtual
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, Status

BASE, PER_SEQ, PREFILL = 0.01, 0.001, 0.0001


def engine(length: int = 10, **kw) -> SimEngine:
    return SimEngine(
        SimEngineConfig(
            decode_base_s=BASE,
            decode_per_seq_s=PER_SEQ,
            prefill_per_token_s=PREFILL,
            response_length=LengthDist(kind="fixed", median=length),
            **kw,
        )
    )


def sample(i: int, prompt: int = 20) -> Sample:
    return Sample(index=i, group_index=i, prompt_tokens=[0] * prompt)


def test_one_request_alone_finishes_after_prefill_plus_length_steps():
    async def main():
        eng = engine(10)
        s = await eng.generate(sample(0), SamplingParams(max_new_tokens=100))
        return asyncio.get_running_loop().time(), s

    t, s = run_virtual(main())
    assert t == pytest.approx(20 * PREFILL + 10 * (BASE + PER_SEQ))
    assert s.status == Status.COMPLETED and s.response_length == 10 and s.weight_versions == ["0"]


def test_two_requests_share_steps_and_the_batch_shrinks_when_one_leaves():
    async def main():
        eng = engine(10)
        loop = asyncio.get_running_loop()
        short = eng.generate(sample(0), SamplingParams(max_new_tokens=4))  # truncated at 4 tokens
        long = eng.generate(sample(1), SamplingParams(max_new_tokens=100))
        await short
        t_short = loop.time()
        await long
        return t_short, loop.time(), short.result(), long.result()

    t_short, t_long, s, long_result = run_virtual(main())
    first = 40 * PREFILL + 4 * (BASE + 2 * PER_SEQ)
    assert t_short == pytest.approx(first)
    assert t_long == pytest.approx(first + 6 * (BASE + PER_SEQ))
    assert s.status == Status.TRUNCATED and long_result.status == Status.COMPLETED


def test_admitting_steps_count_the_steps_that_ran_a_prefill_batch():
    """Two requests submitted together join in one step; one submitted while they decode
    joins at the next boundary, in a second admitting step; the other steps only decode."""

    async def main():
        eng = engine(10)
        first = [eng.generate(sample(i), SamplingParams(max_new_tokens=100)) for i in (0, 1)]
        await asyncio.sleep(3.5 * (BASE + 2 * PER_SEQ))  # inside the fourth step
        late = eng.generate(sample(2), SamplingParams(max_new_tokens=100))
        await asyncio.gather(*first, late)
        return eng.stats

    stats = run_virtual(main())
    assert stats["admitting_steps"] == 2 and stats["requests"] == 3
    assert stats["steps"] == 4 + 10  # the late request joins after step 4 and decodes 10 more


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_pause_modes_record_versions_and_kv_provenance(mode):
    async def main():
        eng = engine(10)
        fut = eng.generate(sample(0), SamplingParams(max_new_tokens=100))
        await asyncio.sleep(20 * PREFILL + 4.5 * (BASE + PER_SEQ))  # mid-step 5
        await eng.pause_generation(mode)
        await eng.update_weights(1, None)
        await eng.continue_generation()
        return await fut

    s = run_virtual(main())
    if mode == "abort":
        assert s.status == Status.ABORTED and s.token_versions.runs == [[0, 0, 5]] and s.weight_versions == ["0"]
    elif mode == "retract":
        assert s.token_versions.runs == [[0, 0, 5], [1, 1, 5]]  # prefix recomputed under version 1
        assert s.weight_versions == ["1"]  # Miles records only the completion-time version
    else:
        assert s.token_versions.runs == [[0, 0, 5], [1, 0, 5]]  # new weights on old KV
        assert s.token_versions.old_kv_token_count() == 5


def test_update_weights_while_generating_is_refused():
    async def main():
        eng = engine(10)
        eng.generate(sample(0), SamplingParams())
        await asyncio.sleep(0.001)
        await eng.update_weights(1, None)

    with pytest.raises(RuntimeError, match="call pause_generation"):
        run_virtual(main())


def test_nothing_is_admitted_while_paused():
    async def main():
        eng = engine(10)
        await eng.pause_generation("retract")
        fut = eng.generate(sample(0), SamplingParams())
        await asyncio.sleep(5.0)
        assert not fut.done() and not eng.running
        await eng.continue_generation()
        return await fut

    assert run_virtual(main()).response_length == 10


def _retracted_batch_run(then):
    """Requests 0-2 (10 tokens each; max_new_tokens 10, 12 and 14) decode, request 3 (9
    tokens) waits behind them (max_running 3); mid-step 5 the engine is paused with
    ``retract`` and ``then(engine, futures)`` runs while it is paused; then version 1 is
    loaded and the engine resumes. Returns each sample (or ``"cancelled"``), the
    (kind, index) of the engine's request events and its stats."""
    from harness.trace import TraceRecorder

    async def main():
        loop = asyncio.get_running_loop()
        eng = engine(10, max_running=3)
        eng.sink = TraceRecorder(loop.time)
        futs = [eng.generate(sample(i), SamplingParams(max_new_tokens=n)) for i, n in enumerate((10, 12, 14, 9))]
        await asyncio.sleep(60 * PREFILL + 4.5 * (BASE + 3 * PER_SEQ))  # mid-step 5
        await eng.pause_generation("retract")
        await then(eng, futs)
        await eng.update_weights(1, None)
        await eng.continue_generation()
        out = []
        for f in futs:
            try:
                out.append(await f)
            except asyncio.CancelledError:
                out.append("cancelled")
        kinds = ("admitted", "retracted", "paused_req", "finished", "aborted")
        events = [(e.kind, e["index"]) for e in eng.sink.events if e.kind in kinds]
        readmitted = [
            (e["index"], e["version"], e["prefix_tokens"])
            for e in eng.sink.events
            if e.kind == "admitted" and e["version"] == 1
        ]
        return out, events, readmitted, dict(eng.stats)

    return run_virtual(main())


# the request events up to the retract, the same in every run below
_RETRACT = [("admitted", 0), ("admitted", 1), ("admitted", 2), ("retracted", 0), ("retracted", 1), ("retracted", 2)]


@pytest.mark.parametrize("again", [None, "in_place", "retract"])
def test_a_retracted_batch_is_admitted_again_first_in_batch_order(again):
    """Resumed, the batch joins again in batch order ahead of the queue, prefilling prompt
    plus tokens so far under version 1; a second pause while paused changes nothing."""

    async def then(eng, futs):
        if again is not None:
            await eng.pause_generation(again)

    out, events, readmitted, stats = _retracted_batch_run(then)
    assert events == _RETRACT + [
        ("admitted", 0),
        ("admitted", 1),
        ("admitted", 2),
        ("finished", 0),
        ("finished", 1),
        ("finished", 2),
        ("admitted", 3),
        ("finished", 3),
    ]
    assert readmitted == [(0, 1, 25), (1, 1, 25), (2, 1, 25), (3, 1, 20)]
    assert [s.token_versions.runs for s in out] == [[[0, 0, 5], [1, 1, 5]]] * 3 + [[[1, 1, 9]]]
    assert all(len(s.response_tokens) == len(s.rollout_log_probs) == len(s.token_versions) for s in out)
    assert stats == {"tokens": 39, "steps": 19, "prefill_tokens": 155, "requests": 4, "admitting_steps": 3}


def test_a_retracted_request_cancelled_while_paused_is_not_admitted_again():
    async def cancel_one(eng, futs):
        futs[1].cancel()
        await asyncio.sleep(0)

    out, events, readmitted, stats = _retracted_batch_run(cancel_one)
    assert out[1] == "cancelled"
    assert events == _RETRACT + [
        ("admitted", 0),
        ("admitted", 2),
        ("admitted", 3),
        ("finished", 0),
        ("finished", 2),
        ("finished", 3),
    ]
    assert stats == {"tokens": 34, "steps": 14, "prefill_tokens": 130, "requests": 4, "admitting_steps": 2}


def test_a_step_counted_while_a_retracted_batch_waits_fails_the_resume_loudly():
    """The batch keeps its place in the finish heap because no step runs while paused; an
    engine (or subclass) that counts one anyway is stopped, not left finishing requests late."""

    async def step_while_paused(eng, futs):
        eng._step += 1

    with pytest.raises(RuntimeError, match="an engine step ran while the engine was paused"):
        _retracted_batch_run(step_while_paused)


def test_a_batch_retracted_and_cancelled_whole_leaves_no_mark_on_the_next_retract():
    """Every retracted request cancelled while paused, and nothing queued: the resume has
    nothing to admit, and a later retract still takes the batch running then."""
    from harness.trace import TraceRecorder

    async def main():
        eng = engine(10)
        eng.sink = TraceRecorder(asyncio.get_running_loop().time)
        first = eng.generate(sample(0), SamplingParams(max_new_tokens=100))
        await asyncio.sleep(20 * PREFILL + 4.5 * (BASE + PER_SEQ))
        await eng.pause_generation("retract")
        first.cancel()
        await asyncio.sleep(0)
        await eng.continue_generation()
        second = eng.generate(sample(1), SamplingParams(max_new_tokens=100))
        await asyncio.sleep(0.5 * BASE + 20 * PREFILL + 3 * (BASE + PER_SEQ))
        await eng.pause_generation("retract")
        await eng.update_weights(1, None)
        await eng.continue_generation()
        s = await second
        return [(e.kind, e["index"]) for e in eng.sink.events if e.kind == "retracted"], s.token_versions.runs

    retracted, runs = run_virtual(main())
    assert retracted == [("retracted", 0), ("retracted", 1)]
    assert runs[0][0] == 0 and runs[-1][:2] == [1, 1] and sum(r[2] for r in runs) == 10


def test_an_abort_of_a_retracted_engine_aborts_the_batch_first_then_the_queue():
    async def abort(eng, futs):
        await eng.pause_generation("abort")

    out, events, readmitted, stats = _retracted_batch_run(abort)
    assert events == _RETRACT + [
        ("aborted", 0),
        ("finished", 0),
        ("aborted", 1),
        ("finished", 1),
        ("aborted", 2),
        ("finished", 2),
        ("aborted", 3),
        ("finished", 3),
    ]
    assert [s.status for s in out] == [Status.ABORTED] * 4 and [s.response_length for s in out] == [5, 5, 5, 0]
    assert readmitted == [] and stats["steps"] == 5


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_a_pause_waiting_for_a_boundary_completes_when_the_last_request_is_cancelled(mode):
    """Found by a fully-async run whose worker died during a weight update: the pause
    waited for a step boundary that the cancelled request would never reach."""

    async def main():
        eng = engine(10)
        fut = eng.generate(sample(0), SamplingParams(max_new_tokens=100))
        await asyncio.sleep(0.005)  # inside the first decode step
        pause = asyncio.ensure_future(eng.pause_generation(mode))
        await asyncio.sleep(0)
        assert not pause.done()
        fut.cancel()
        await pause
        return eng.paused, eng.running

    assert run_virtual(main()) == (True, {})


def test_a_deadlocked_simulation_raises_instead_of_hanging():
    async def main():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(VirtualDeadlock, match="every task is blocked"):
        run_virtual(main())


def test_response_lengths_are_keyed_by_sample_not_by_schedule():
    dist = LengthDist(kind="lognormal", median=50, sigma=1.0)
    cfg = SimEngineConfig(response_length=dist, seed=3)

    async def lengths(order):
        eng = SimEngine(cfg)
        futs = {i: eng.generate(sample(i), SamplingParams(max_new_tokens=10_000)) for i in order}
        return {i: (await f).response_length for i, f in futs.items()}

    assert run_virtual(lengths([0, 1, 2, 3])) == run_virtual(lengths([3, 1, 0, 2]))


@pytest.mark.parametrize("median,sigma,seed", [(64.0, 0.8, 0), (50, 1.0, 3), (0.7, 2.0, 11)])
def test_a_first_attempt_is_as_long_as_length_dist_draws(median, sigma, seed):
    """A fresh request's length is ``LengthDist.draw(uniform(seed, index, 0))``, the clamp
    to 1 included (a median of 0.7 rounds many to 0)."""
    dist = LengthDist(kind="lognormal", median=median, sigma=sigma)
    indices = [*range(0, 40), 1023, 1024, 7 << 10]
    expected = {i: dist.draw(uniform(seed, i, 0)) for i in indices}

    async def lengths():
        eng = SimEngine(SimEngineConfig(response_length=dist, seed=seed))
        futs = {i: eng.generate(sample(i), SamplingParams(max_new_tokens=10_000)) for i in indices}
        return {i: (await f).response_length for i, f in futs.items()}

    assert run_virtual(lengths()) == expected
    if median < 1:
        assert min(expected.values()) == 1 and max(expected.values()) > 1  # the clamp was exercised


def test_bad_engine_config_names_the_field():
    with pytest.raises(ConfigError, match="engine.decode_base_s"):
        SimEngineConfig(decode_base_s=0)
