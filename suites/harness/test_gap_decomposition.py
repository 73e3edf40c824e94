"""Kernel vs staleness decomposition on real samples from the torch engine and trainer.

The staleness loop is a one-step-ahead schedule on the real ``EngineCore`` and
``TorchTrainer``: batch ``i + 1`` is generated before the trainer steps on batch ``i``,
and the engine pulls weights every ``k`` trainer steps (``update_weights_interval``),
so sample ages run from 0 (the first batch) to ``k``. With fp32 on both sides the
kernel part is float noise (the engine's incremental decode vs the trainer's full
forward with the same weights) at every age, while the staleness part is exactly 0 at
age 0 and grows with the age.
"""

from __future__ import annotations

import random

import pytest
import torch

from harness.measure.gap_decompose import GapTracker, VersionStore, decompose_samples, summarize, token_categories
from harness.backends.tasks import CopyTask, make_groups
from harness.backends.torch_engine import EngineCore, fill_sample, run_groups
from harness.backends.torch_models import TinyLM, TinyLMConfig
from harness.backends.torch_trainer import TorchTrainer, TrainerConfig
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, VersionRuns

TASK = CopyTask(n_symbols=3, length=3)
CFG = TinyLMConfig(vocab_size=TASK.tokenizer.vocab_size, max_seq_len=32, seed=7)
FLOAT_NOISE = 1e-5  # fp32 engine decode vs full forward, same weights


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model]  # fixture in the root conftest.py


def build() -> TinyLM:
    return TinyLM(CFG)


def one_step_ahead(k: int, *, steps: int, seed: int = 0) -> list:
    """Decompositions of every trained batch of a one-step-ahead loop with interval k.

    The engine numbers versions by updates as the drivers do (1 = the initial load);
    ``GapTracker`` translates them to the trainer's optimizer step counts."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    trainer = TorchTrainer(build(), TrainerConfig(lr=1e-3))
    engine = EngineCore(build(), max_running=16, eos_token_id=TASK.eos_token_id)
    tracker = GapTracker(capacity=3, model_builder=build, temperature=1.0)

    def sync_weights() -> None:
        weights = trainer.get_weights()
        engine.pause("retract")
        engine.update_weights(engine.version + 1, weights)
        engine.resume()
        tracker.on_engine_update(engine.version, trainer.optimizer_steps, weights)

    sync_weights()
    sampling = SamplingParams(max_new_tokens=TASK.max_new_tokens, temperature=1.0)
    next_index = 0

    def generate() -> list[list[Sample]]:
        nonlocal next_index
        groups = make_groups(TASK, rng, rollout_batch_size=4, n_samples_per_prompt=4, first_index=next_index)
        next_index += 16
        run_groups(engine, groups, sampling, seed=seed)
        for s in (s for g in groups for s in g):
            s.reward = TASK.reward(s)
        return groups

    pending = generate()
    for step in range(steps):
        batch, pending = pending, generate()  # one step ahead: the next batch is made first
        metrics = tracker.observe(
            step,
            [s for g in batch for s in g],
            current_weights=trainer.get_weights(),
            optimizer_steps=trainer.optimizer_steps,
        )
        assert metrics["gap/num_tokens"] == sum(s.response_length for g in batch for s in g)
        trainer.train_step(batch)
        if trainer.optimizer_steps % k == 0:
            sync_weights()
    return tracker.decompositions


@pytest.fixture(scope="module")
def staleness_runs() -> dict[int, list]:
    return {k: one_step_ahead(k, steps=2 * k + 2) for k in (1, 2, 4)}


def test_sample_ages_of_the_one_step_ahead_loop_run_from_zero_to_k(staleness_runs):
    for k, decomps in staleness_runs.items():
        assert sorted({d.meta["age"] for d in decomps}) == list(range(0, k + 1))


def test_staleness_gap_grows_with_sample_age_and_kernel_gap_stays_at_float_noise(staleness_runs):
    pooled = [d for decomps in staleness_runs.values() for d in decomps]
    by_age = summarize(pooled)["by_age"]
    ages = sorted(by_age)
    assert ages == [0, 1, 2, 3, 4]
    staleness = [by_age[a]["staleness_abs_mean"] for a in ages]
    kernel = [by_age[a]["kernel_abs_mean"] for a in ages]
    assert staleness[0] == 0.0  # the same weights, the same forward: bitwise equal
    assert all(b > a for a, b in zip(staleness, staleness[1:])), staleness
    assert staleness[1] > 100 * FLOAT_NOISE
    assert all(0 < x < FLOAT_NOISE for x in kernel), kernel  # noise, not exact, and no trend to speak of
    assert max(kernel) < staleness[1] / 100
    for d in pooled:
        assert float(d.kernel.abs().max()) < FLOAT_NOISE
        assert set(d.categories) == ({"fresh"} if d.meta["age"] == 0 else {"stale"})


def test_kernel_plus_staleness_equals_total_for_every_token(staleness_runs):
    for decomps in staleness_runs.values():
        for d in decomps:
            assert torch.allclose(d.kernel + d.staleness, d.total, rtol=0, atol=1e-12)


def perturbed(weights: dict[str, torch.Tensor], *, seed: int, scale: float = 0.02) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in weights.items()}


def generate_across_an_update(mode: str) -> tuple[list[Sample], VersionStore, dict[str, torch.Tensor]]:
    """Four samples: three tokens under version 0, then the engine pauses in ``mode``,
    loads version 1 and finishes the remaining five tokens."""
    model = build()
    core = EngineCore(model, max_running=4)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]
    samples = [Sample(prompt_tokens=p, index=i) for i, p in enumerate(prompts)]
    for s in samples:
        core.add_request(s.index, s.prompt_tokens, 8, 1.0, seed=50 + s.index)
    for _ in range(3):
        assert core.step() == []
    core.pause(mode)
    v0, v1 = model.weights_copy(), perturbed(model.weights_copy(), seed=1)
    core.update_weights(1, v1)
    core.resume()
    while core.has_work():
        for done in core.step():
            fill_sample(samples[done.req_id], done)
    store = VersionStore(2)
    store.put(0, v0)
    store.put(1, v1)
    return samples, store, v1


def test_a_retracted_sample_spans_two_versions_and_every_token_is_scored_by_its_own_weights():
    samples, store, current = generate_across_an_update("retract")
    decomps = decompose_samples(samples, store, current, build, 1.0, current_version=1, step=0)
    for s, d in zip(samples, decomps):
        assert s.token_versions == VersionRuns([[0, 0, 3], [1, 1, 5]])  # re-prefilled under version 1
        assert d.categories == ("stale",) * 3 + ("fresh",) * 5
        assert d.meta["versions"] == [0, 1] and d.meta["age"] == 1
        assert float(d.kernel.abs().max()) < FLOAT_NOISE
        assert float(d.staleness[:3].abs().min()) > 1e-4  # version 0 tokens vs version 1 weights
        assert torch.equal(d.staleness[3:], torch.zeros(5, dtype=torch.float64))


def test_in_place_tokens_are_their_own_category_and_their_kernel_gap_is_not_float_noise():
    """``in_place`` keeps the KV written by version 0 and samples with version 1 on top
    of it. The trainer's forward with version 1 recomputes every K/V with version 1, so
    even with identical kernels the engine and trainer saw different activations: the
    kernel part of these tokens carries a policy mixture, far above float noise."""
    samples, store, current = generate_across_an_update("in_place")
    decomps = decompose_samples(samples, store, current, build, 1.0, current_version=1, step=0)
    for s, d in zip(samples, decomps):
        assert s.token_versions == VersionRuns([[0, 0, 3], [1, 0, 5]])
        assert d.categories == ("stale",) * 3 + ("in_place_old_kv",) * 5
        assert float(d.kernel[:3].abs().max()) < FLOAT_NOISE
        assert float(d.kernel[3:].abs().mean()) > 100 * FLOAT_NOISE
        assert torch.equal(d.staleness[3:], torch.zeros(5, dtype=torch.float64))
    cats = summarize(decomps)["by_category"]
    assert cats["in_place_old_kv"]["kernel_abs_mean"] > 100 * cats["stale"]["kernel_abs_mean"]


def test_token_categories_follow_version_and_kv_version():
    s = Sample(token_versions=VersionRuns([[2, 2, 1], [3, 2, 2], [4, 4, 1]]))
    assert token_categories(s, 4) == ["stale", "in_place_old_kv", "in_place_old_kv", "fresh"]


def test_the_store_evicts_the_oldest_version_and_says_how_to_keep_it():
    store = VersionStore(2)
    w = {"w": torch.ones(2)}
    for v in range(3):
        store.put(v, w)
    assert store.versions() == [1, 2]
    with pytest.raises(ConfigError, match=r"version 0 was evicted.*capacity=2.*Fix"):
        store.get(0)
    with pytest.raises(ConfigError, match="never stored"):
        store.get(9)
    w["w"] += 1  # put stored a copy
    assert torch.equal(store.get(2)["w"], torch.ones(2))
    with pytest.raises(ConfigError, match="capacity=0"):
        VersionStore(0)


def test_a_sample_newer_than_the_current_version_is_refused():
    s = Sample(
        prompt_tokens=[3], response_tokens=[4], rollout_log_probs=[-1.0], token_versions=VersionRuns([[2, 2, 1]])
    )
    with pytest.raises(ConfigError, match="current_version=1"):
        decompose_samples([s], VersionStore(2), build().weights_copy(), build, 1.0, current_version=1)


def test_the_tracker_refuses_a_sample_from_an_unreported_engine_version():
    tracker = GapTracker(capacity=2, model_builder=build, temperature=1.0)
    tracker.on_engine_update(1, 0, build().weights_copy())
    s = Sample(
        prompt_tokens=[3],
        response_tokens=[4],
        rollout_log_probs=[-1.0],
        token_versions=VersionRuns([[2, 2, 1]]),
        index=5,
    )
    with pytest.raises(ConfigError, match=r"sample 5 .*engine version 2.*known: \[1\].*on_engine_update"):
        tracker.observe(0, [s], current_weights=build().weights_copy(), optimizer_steps=0)
