"""``SGLangEngine`` against a real SGLang engine on a CUDA GPU (skipped elsewhere with the
reason from ``conftest.py``): generation with log-probs, the three pause modes across a
weight update, and ``update_weights_from_tensor`` changing both outputs and the version.

The pause tests submit long ``ignore_eos`` requests, wait on the real clock until they
are decoding (this is an integration test: the engine runs in other processes), then
pause. Whether a request was caught mid-flight is asserted from SGLang's own per-token
version spans, so a pause that came too late fails instead of passing vacuously.
"""

from __future__ import annotations

import asyncio

import pytest

from miles_async_core.types import Sample, SamplingParams, Status

pytestmark = pytest.mark.gpu

LONG = SamplingParams(max_new_tokens=1500, temperature=1.0)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
DECODE_HEAD_START_S = 1.0
N_REQUESTS = 4


def make_samples(tokenizer, n: int, *, first_index: int) -> list[Sample]:
    prompt = "Count from one to one thousand, writing every number as a word:"
    tokens = tokenizer(prompt)["input_ids"]
    return [
        Sample(prompt=prompt, prompt_tokens=list(tokens), index=first_index + i, group_index=first_index)
        for i in range(n)
    ]


async def generate(engine, sample, sampling):
    """``generate`` schedules a task on the running loop, so call it from inside one."""
    return await engine.generate(sample, sampling)


def test_generate_returns_one_log_prob_and_one_version_per_token(engine, run, tokenizer):
    (sample,) = make_samples(tokenizer, 1, first_index=0)
    run(generate(engine, sample, GREEDY))
    assert sample.status in (Status.COMPLETED, Status.TRUNCATED)
    assert 0 < len(sample.response_tokens) <= GREEDY.max_new_tokens
    assert len(sample.rollout_log_probs) == len(sample.response_tokens) == len(sample.token_versions)
    assert all(lp <= 0.0 for lp in sample.rollout_log_probs)
    assert len(sample.weight_versions) == 1
    assert sample.token_versions.oldest == sample.token_versions.newest == engine.weight_version
    assert sample.metadata["token_versions_exact"] is True


def test_greedy_generation_is_reproducible(engine, run, tokenizer):
    a, b = make_samples(tokenizer, 2, first_index=10)
    run(generate(engine, a, GREEDY))
    run(generate(engine, b, GREEDY))
    assert a.response_tokens == b.response_tokens


async def _pause_update_continue(engine, samples, mode, weights):
    engine.sampling_overrides["ignore_eos"] = True
    try:
        tasks = [engine.generate(s, LONG) for s in samples]
        await asyncio.sleep(DECODE_HEAD_START_S)  # real clock: the engine decodes in other processes
        old = engine.weight_version
        await engine.pause_generation(mode)
        if mode == "abort":  # abort finishes every request before the update
            done = await asyncio.gather(*tasks)
        await engine.update_weights(old + 1, weights)
        await engine.continue_generation()
        if mode != "abort":
            done = await asyncio.gather(*tasks)
        return old, done
    finally:
        del engine.sampling_overrides["ignore_eos"]


def test_abort_pause_finishes_requests_with_partial_output_and_the_old_version(
    engine, run, tokenizer, original_weights
):
    samples = make_samples(tokenizer, N_REQUESTS, first_index=100)
    old, done = run(_pause_update_continue(engine, samples, "abort", original_weights))
    for s in done:
        assert s.status == Status.ABORTED
        assert 0 < s.response_length < LONG.max_new_tokens
        assert s.token_versions.to_json() == [[old, old, s.response_length]]
        assert len(s.rollout_log_probs) == s.response_length


def test_retract_pause_reprefills_under_the_new_version(engine, run, tokenizer, original_weights):
    samples = make_samples(tokenizer, N_REQUESTS, first_index=200)
    old, done = run(_pause_update_continue(engine, samples, "retract", original_weights))
    new = old + 1
    for s in done:
        assert s.status == Status.TRUNCATED and s.response_length == LONG.max_new_tokens
        runs = s.token_versions.to_json()
        assert [r[:2] for r in runs] == [[old, old], [new, new]], runs  # caught mid-flight, KV recomputed
        assert s.weight_versions == [str(new)]
        assert s.metadata["num_retractions"] >= 1
        assert s.metadata["token_versions_exact"] is True


def test_in_place_pause_decodes_new_weights_on_old_kv(engine, run, tokenizer, original_weights):
    samples = make_samples(tokenizer, N_REQUESTS, first_index=300)
    old, done = run(_pause_update_continue(engine, samples, "in_place", original_weights))
    new = old + 1
    for s in done:
        assert s.status == Status.TRUNCATED and s.response_length == LONG.max_new_tokens
        runs = s.token_versions.to_json()
        assert [r[:2] for r in runs] == [[old, old], [new, old]], runs
        assert s.token_versions.old_kv_token_count() == runs[1][2]
        assert s.oldest_weight_version == new  # Miles' view under-reports (it records the version at completion)


def test_update_weights_from_tensor_changes_outputs_and_the_version(engine, run, tokenizer, original_weights):
    import torch

    before, after, restored = make_samples(tokenizer, 3, first_index=400)
    generator = torch.Generator(device="cuda").manual_seed(0)
    perturbed = {
        name: w + 0.5 * w.float().std() * torch.randn(w.shape, generator=generator, device="cuda").to(w.dtype)
        if w.dim() >= 2
        else w
        for name, w in original_weights.items()
    }

    async def scenario():
        # Start from an empty prefix cache so `before` and `restored` prefill alike.
        for weights, sample in ((original_weights, before), (perturbed, after), (original_weights, restored)):
            await engine.pause_generation("retract")
            await engine.update_weights(engine.weight_version + 1, weights)
            await engine.continue_generation()
            await engine.generate(sample, GREEDY)

    run(scenario())
    version = engine.weight_version
    assert [s.weight_versions for s in (before, after, restored)] == [
        [str(version - 2)],
        [str(version - 1)],
        [str(version)],
    ]
    assert after.response_tokens != before.response_tokens
    assert restored.response_tokens == before.response_tokens  # the original weights load back exactly
    assert restored.rollout_log_probs == pytest.approx(before.rollout_log_probs, abs=2e-2)  # bf16, same batch shape
