"""A simulated trainer: a step costs ``step_base_s + per_token_s * tokens`` of virtual
time (longer under contention, ``harness.sim.contention``); its "weights" are the number
of optimizer steps taken, so a weight version's provenance is exact. ``fail_at_step``
injects a trainer exception. ``state_dict`` / ``load_state_dict`` are its checkpoint (a
run with lives, ``harness.lives``): the optimizer steps, which are its weights."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from miles_async_core.errors import ConfigError
from miles_async_core.types import samples_of


class TrainerStepError(RuntimeError):
    """An injected failure of one training step."""


@dataclass(frozen=True, kw_only=True)
class SimTrainerConfig:
    step_base_s: float = 1.0
    per_token_s: float = 0.0
    fail_at_step: int | None = None

    def __post_init__(self) -> None:
        for name in ("step_base_s", "per_token_s"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"trainer.{name} = {getattr(self, name)!r}: must be >= 0 seconds; fix: use 0 or a positive number"
                )


class SimTrainer:
    def __init__(self, config: SimTrainerConfig | None = None) -> None:
        self.cfg = config or SimTrainerConfig()
        self.steps = 0
        self.consumed: list[list[int]] = []  # sample indices per step, for differential checks
        self.contention: Any = None  # harness.sim.contention.Contention, or None: a step takes its cost

    async def train(self, rollout_id: int, groups: list[Any]) -> dict[str, float]:
        # one pass over the batch for the step's cost, its sample indices and its rewards
        indices, tokens, reward_sum, rewarded = [], 0, 0, 0
        for g in groups:
            for s in samples_of(g):
                indices.append(s.index)
                tokens += len(s.response_tokens)
                if s.reward is not None:
                    reward_sum += s.reward  # in batch order, as sum() of the rewards adds them
                    rewarded += 1
        if self.cfg.fail_at_step is not None and self.steps == self.cfg.fail_at_step:
            raise TrainerStepError(f"injected trainer failure at step {self.steps} (rollout_id={rollout_id})")
        if self.contention is None:
            await asyncio.sleep(self.cfg.step_base_s + self.cfg.per_token_s * tokens)
        else:
            await self.contention.train(self.cfg.step_base_s + self.cfg.per_token_s * tokens)
        self.steps += 1
        self.consumed.append(indices)
        return {"train/tokens": float(tokens), "train/reward_mean": reward_sum / rewarded if rewarded else 0.0}

    def get_weights(self) -> int:
        return self.steps

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])
