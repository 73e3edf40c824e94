"""The GRPO trainer on the tiny model: advantages, the LR rule, the train/rollout gap,
TIS, and reward rising in a short synchronous RL loop on the copy task."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from harness.backends.tasks import TINY_TOKENIZER, CopyTask, make_groups
from harness.backends.torch_engine import EngineCore, run_groups
from harness.backends.torch_models import TinyLM, TinyLMConfig
from harness.backends.torch_trainer import TorchTrainer, TrainerConfig, grpo_advantages
from miles_async_core.errors import ConfigError
from miles_async_core.types import SamplingParams

CFG = TinyLMConfig(vocab_size=TINY_TOKENIZER.vocab_size, max_seq_len=32, seed=0)
TASK = CopyTask(n_symbols=3, length=2)


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model]  # fixture in the root conftest.py


def rollout(core: EngineCore, rng: random.Random, step: int, *, b: int = 8, n: int = 4, random_rewards=False):
    groups = make_groups(TASK, rng, rollout_batch_size=b, n_samples_per_prompt=n, first_index=step * b * n)
    run_groups(core, groups, SamplingParams(max_new_tokens=TASK.max_new_tokens))
    for group in groups:
        for s in group:  # random rewards guarantee a non-zero gradient on an untrained model
            s.reward = rng.random() if random_rewards else TASK.reward(s)
    return groups


def sync_weights(core: EngineCore, trainer: TorchTrainer, version: int) -> None:
    core.pause("in_place")
    core.update_weights(version, trainer.get_weights())
    core.resume()


def test_grpo_advantages_are_group_normalised_and_a_lone_sample_is_only_centred():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.tolist() == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)  # std (unbiased) = 0.577
    assert grpo_advantages(torch.tensor([0.7])).tolist() == [0.0]
    assert grpo_advantages(torch.tensor([0.5, 0.5])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("scaling", "factor"), [("none", 1), ("interval", 4), ("staleness", 3)])
def test_the_lr_rule_divides_the_base_lr_and_train_lr_logs_the_rate_used(scaling, factor):
    cfg = TrainerConfig(lr=1e-3, lr_scaling=scaling, update_weights_interval=4, max_weight_staleness=2)
    trainer = TorchTrainer(TinyLM(CFG), cfg)
    core = EngineCore(TinyLM(CFG), max_running=8, eos_token_id=TASK.eos_token_id)
    metrics = trainer.train_step(rollout(core, random.Random(0), 0, b=2, n=2))
    assert metrics["train/lr"] == pytest.approx(1e-3 / factor)


def test_the_log_prob_gap_is_numerics_only_with_identical_weights_and_grows_when_stale():
    trainer = TorchTrainer(TinyLM(CFG), TrainerConfig(lr=3e-3))
    core = EngineCore(TinyLM(CFG), max_running=32, eos_token_id=TASK.eos_token_id)
    rng = random.Random(1)
    fresh = trainer.train_step(rollout(core, rng, 0, random_rewards=True))
    assert fresh["train/train_rollout_logprob_abs_diff"] < 1e-5
    stale = trainer.train_step(rollout(core, rng, 1, random_rewards=True))  # engine still on the initial weights
    assert stale["train/train_rollout_logprob_abs_diff"] > 1e-3
    sync_weights(core, trainer, 2)
    again = trainer.train_step(rollout(core, rng, 2, random_rewards=True))
    assert again["train/train_rollout_logprob_abs_diff"] < 1e-5
    assert trainer.optimizer_steps == 3


def test_tis_weights_are_the_clipped_ratio_of_trainer_to_rollout_probabilities():
    trainer = TorchTrainer(TinyLM(CFG), TrainerConfig(use_tis=True, tis_clip=2.0, tis_clip_low=0.0))
    core = EngineCore(TinyLM(CFG), max_running=32, eos_token_id=TASK.eos_token_id)
    groups = rollout(core, random.Random(2), 0)
    for group in groups:
        for s in group:  # pretend the behaviour policy was much less likely: exp(1) > tis_clip
            s.rollout_log_probs = [lp - 1.0 for lp in s.rollout_log_probs]
    metrics = trainer.train_step(groups)
    assert metrics["train/tis"] == pytest.approx(2.0)
    assert metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(1.0, abs=1e-5)


def test_reward_rises_on_the_copy_task_in_a_short_synchronous_rl_loop(capsys):
    # lr 2e-3, 150 steps: over model seeds 0-4 the last-10 mean ended in 0.51-0.99
    trainer = TorchTrainer(TinyLM(CFG), TrainerConfig(lr=2e-3))
    core = EngineCore(TinyLM(CFG), max_running=32, eos_token_id=TASK.eos_token_id)
    rng, rewards = random.Random(0), []
    for step in range(150):
        metrics = trainer.train_step(rollout(core, rng, step))
        rewards.append(metrics["train/reward_mean"])
        sync_weights(core, trainer, step + 1)
    start, end = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    with capsys.disabled():
        print(f"\ncopy task, B=8 n=4, 150 steps: reward_mean first 10 = {start:.3f}, last 10 = {end:.3f}")
    # a policy that ignores the prompt scores 1/n_symbols = 0.33 on average at best
    assert start < 0.15 and end > 0.45


def test_train_runs_in_a_worker_thread_so_the_event_loop_keeps_turning():
    trainer = TorchTrainer(TinyLM(CFG), TrainerConfig())
    core = EngineCore(TinyLM(CFG), max_running=32, eos_token_id=TASK.eos_token_id)
    groups = rollout(core, random.Random(3), 0)

    async def main():
        ticks = 0
        task = asyncio.ensure_future(trainer.train(7, groups))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0)
        return ticks, task.result()

    ticks, metrics = asyncio.run(main())
    assert ticks > 1 and metrics["train/rollout_id"] == 7.0
    assert {
        "train/loss",
        "train/reward_mean",
        "train/train_rollout_logprob_abs_diff",
        "train/lr",
        "train/grad_norm",
    } <= set(metrics)


def test_bad_trainer_inputs_raise_clear_errors():
    with pytest.raises(ConfigError, match="lr_scaling='half'"):
        TrainerConfig(lr_scaling="half")
    trainer = TorchTrainer(TinyLM(CFG))
    core = EngineCore(TinyLM(CFG), max_running=4, eos_token_id=TASK.eos_token_id)
    groups = make_groups(TASK, random.Random(0), rollout_batch_size=1, n_samples_per_prompt=2)
    run_groups(core, groups, SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="without a reward"):
        trainer.train_step(groups)


def test_a_seeded_loop_reproduces_its_metrics_exactly():
    def run() -> list[dict]:
        trainer = TorchTrainer(TinyLM(CFG), TrainerConfig(lr=2e-3, use_tis=True))
        core = EngineCore(TinyLM(CFG), max_running=32, eos_token_id=TASK.eos_token_id)
        rng, out = random.Random(5), []
        for step in range(3):
            out.append(trainer.train_step(rollout(core, rng, step)))
            sync_weights(core, trainer, step + 1)
        return out

    first, second = run(), run()
    assert first == second
    # the steps did something: on-policy the loss is -mean(advantage) = 0 up to rounding (exactly
    # 0.0 on some hosts), so it is the gradient that differs from step to step
    assert first[0]["train/grad_norm"] > 0 and len({m["train/grad_norm"] for m in first}) == 3
