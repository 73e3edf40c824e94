"""A real GRPO trainer in torch, implementing the ``Trainer`` contract.

One ``train_step(groups)`` (synchronous, usable in any process; ``train`` runs it in a
worker thread so the event loop is never blocked) does one optimizer step on B groups:

* advantages: GRPO, per group ``(r - mean) / (std + 1e-6)``; with n == 1 only the mean
  is removed (a lone sample has no spread);
* log-probs: ``log_softmax(logits / rollout_temperature)`` of the response tokens, the
  same rule the engine reports (see ``torch_engine``), so with identical weights the
  gap ``train/train_rollout_logprob_abs_diff`` is pure numerics;
* loss: PPO clip (``eps_clip``) of ``ratio = exp(logp - rollout_logp)``, the engine's
  behaviour log-probs as the old policy. With ``use_tis`` it is Miles' decoupled form
  (``vanilla_tis_function`` in ``corrections.py``): the ratio is taken against the
  trainer's own no-grad recomputation ``old`` and the per-token loss is multiplied by
  ``clamp(exp(old - rollout), tis_clip_low, tis_clip)``;
* reduction: per-sample mean over response tokens, then mean over samples (Miles'
  ``sum_of_sample_mean``); samples with no response tokens carry no loss;
* learning rate: ``lr / factor`` with factor 1 (``none``), ``update_weights_interval``
  (``interval``) or ``max_weight_staleness + 1`` (``staleness``); ``train/lr`` logs the
  rate the optimizer really used.

``optimizer_steps`` counts optimizer steps taken (not a weight version: versions count
weight updates, ``RunContext.weight_version``); ``get_weights()`` returns CPU copies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import torch

from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, iter_samples

from .torch_models import EngineModel

LR_SCALINGS = ("none", "interval", "staleness")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    lr: float = 1e-3
    lr_scaling: str = "none"
    update_weights_interval: int = 1
    max_weight_staleness: int = 0
    rollout_temperature: float = 1.0
    eps_clip: float = 0.2
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    clip_grad: float = 1.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(
                f"lr_scaling={self.lr_scaling!r} is not one of {list(LR_SCALINGS)}. "
                f"Fix: pass 'none', 'interval' (lr / update_weights_interval) or 'staleness' "
                f"(lr / (max_weight_staleness + 1))."
            )
        if self.update_weights_interval < 1 or self.max_weight_staleness < 0:
            raise ConfigError(
                f"update_weights_interval={self.update_weights_interval} must be >= 1 and "
                f"max_weight_staleness={self.max_weight_staleness} must be >= 0."
            )
        if self.rollout_temperature <= 0:
            raise ConfigError(f"rollout_temperature={self.rollout_temperature} must be > 0 to train on log-probs.")

    @property
    def lr_factor(self) -> int:
        if self.lr_scaling == "interval":
            return self.update_weights_interval
        if self.lr_scaling == "staleness":
            return self.max_weight_staleness + 1
        return 1

    @property
    def effective_lr(self) -> float:
        return self.lr / self.lr_factor


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [n] of one group -> advantages [n]."""
    centred = rewards - rewards.mean()
    if rewards.numel() == 1:
        return centred
    return centred / (rewards.std() + 1e-6)


def response_log_probs(model: EngineModel, samples: list[Sample], temperature: float) -> list[torch.Tensor]:
    """Per sample, the log-probs of its response tokens under ``model`` (one padded forward)."""
    seqs = [list(s.prompt_tokens) + list(s.response_tokens) for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    logp = torch.log_softmax(model.logits(ids, mask).float() / temperature, dim=-1)
    out = []
    for row, s in enumerate(samples):
        p, r = len(s.prompt_tokens), len(s.response_tokens)
        targets = ids[row, p : p + r].view(-1, 1)
        out.append(logp[row, p - 1 : p - 1 + r].gather(1, targets).view(-1))
    return out


class TorchTrainer:
    def __init__(self, model: EngineModel, config: TrainerConfig | None = None) -> None:
        self.model = model
        self.config = config or TrainerConfig()
        self.optimizer = torch.optim.AdamW(
            model.module.parameters(), lr=self.config.effective_lr, weight_decay=self.config.weight_decay
        )
        self.optimizer_steps = 0

    async def train(self, rollout_id: int, groups: list[Any]) -> dict[str, float]:
        metrics = await asyncio.to_thread(self.train_step, groups)
        metrics["train/rollout_id"] = float(rollout_id)
        return metrics

    def get_weights(self, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        return self.model.weights_copy(out)

    def train_step(self, groups: list[Any]) -> dict[str, float]:
        cfg = self.config
        samples, advantages = self._samples_and_advantages(groups)
        rewards = [s.reward for s in samples if s.reward is not None]
        assert len(rewards) == len(samples), "_samples_and_advantages refuses a sample without a reward"
        trainable = [(s, a) for s, a in zip(samples, advantages) if s.response_tokens]
        self.model.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"train/reward_mean": sum(rewards) / len(rewards)}
        if trainable:
            loss, stats = self._loss([s for s, _ in trainable], [a for _, a in trainable])
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.module.parameters(), cfg.clip_grad)
            self.optimizer.step()
            metrics.update(stats, **{"train/loss": float(loss.detach()), "train/grad_norm": float(grad_norm)})
        metrics["train/lr"] = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer_steps += 1
        self.model.module.eval()
        return metrics

    def _samples_and_advantages(self, groups: list[Any]) -> tuple[list[Sample], list[float]]:
        samples, advantages = [], []
        for group in groups:
            members = list(iter_samples(group))
            missing = [s.index for s in members if s.reward is None]
            if missing:
                raise ValueError(f"samples {missing} reached the trainer without a reward; score them first.")
            advantages += grpo_advantages(
                torch.tensor([float(s.reward) for s in members if s.reward is not None])
            ).tolist()
            samples += members
        if not samples:
            raise ValueError("train_step got no samples")
        return samples, advantages

    def _loss(self, samples: list[Sample], advantages: list[float]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        logps = response_log_probs(self.model, samples, cfg.rollout_temperature)
        per_sample, abs_diff, clipfrac, tis_mean = [], [], [], []
        for s, adv, logp in zip(samples, advantages, logps):
            rollout = torch.tensor(s.rollout_log_probs, dtype=torch.float32, device=logp.device)
            if rollout.numel() != logp.numel():
                raise ValueError(f"sample {s.index}: {rollout.numel()} rollout_log_probs for {logp.numel()} tokens")
            old = logp.detach() if cfg.use_tis else rollout
            ratio = torch.exp(logp - old)
            clipped = ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip)
            token_loss = torch.maximum(-adv * ratio, -adv * clipped)
            if cfg.use_tis:
                tis = torch.exp(logp.detach() - rollout).clamp(cfg.tis_clip_low, cfg.tis_clip)
                token_loss = token_loss * tis
                tis_mean.append(float(tis.mean()))
            per_sample.append(token_loss.mean())
            abs_diff.append(float((logp.detach() - rollout).abs().mean()))
            clipfrac.append(float(((ratio - 1).abs() > cfg.eps_clip).float().mean()))
        loss = torch.stack(per_sample).mean()
        stats = {"train/train_rollout_logprob_abs_diff": _mean(abs_diff), "train/pg_clipfrac": _mean(clipfrac)}
        if tis_mean:
            stats["train/tis"] = _mean(tis_mean)
        return loss, stats


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)
