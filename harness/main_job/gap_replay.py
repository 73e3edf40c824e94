"""The per-step trainer-engine gap decomposition of a main-job run, computed after its
timed window by replaying training (``GapRecorder``), and the trainer wrapper that
records each step's batch for it and reports finished steps (``SteppedTrainer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.backends.torch_trainer import TorchTrainer
from harness.main_job.layouts import ModelBuilder, fresh_trainer
from harness.main_job.result import StepMetrics
from harness.main_job.spec import RunSpec
from miles_async_core.config import AsyncConfig


class GapRecorder:
    """The per-step trainer-engine gap decomposition, computed after the timed run by
    replaying training, so it costs the timed run nothing and holds few weight copies.

    During the run it records only what is already in memory: each step's training batch
    (a reference to the groups the trainer gets, and the trainer's optimizer step count
    then) and, at each engine weight load, the step count of the weights loaded. It
    copies no weights. ``finish`` (after ``t1``) builds a fresh trainer from the same
    seed and config and replays the recorded batches in order; just before replaying
    step ``i`` its weights are the weights step ``i`` trained from, so that step's
    samples are decomposed against them (``GapTracker.observe``), and every version
    loaded into the engine at that step count is stored (``GapTracker.on_engine_update``).
    The store keeps exactly as many versions as some step's samples still need (the
    longest run of loaded versions between a step's oldest token version and the step
    itself): one copy for sync, two for one-step-ahead, max staleness + 2 at most, never
    steps + 2. The replay is checked against the run: its final weights must equal the
    trained model's bit for bit (``replay_exact`` in the summary; the largest
    difference in ``replay_max_abs_diff``)."""

    def __init__(self, spec: RunSpec, build: ModelBuilder, config: AsyncConfig) -> None:
        self.spec, self.build, self.config = spec, build, config
        self.steps: list[tuple[int, list[Any], int]] = []  # (rollout_id, groups, optimizer steps before it)
        self.loaded: list[tuple[int, int]] = []  # (engine version, optimizer steps of its weights)

    def wrap_engine(self, engine: Any, trainer: TorchTrainer) -> Any:
        loaded = self.loaded

        class _Recording:
            def __getattr__(self, name: str) -> Any:
                return getattr(engine, name)

            def generate(self, sample: Any, sampling: Any) -> Any:
                return engine.generate(sample, sampling)

            async def pause_generation(self, mode: str) -> None:
                await engine.pause_generation(mode)

            async def update_weights(self, version: int, weights: Any) -> None:
                await engine.update_weights(version, weights)
                loaded.append((int(version), trainer.optimizer_steps))

            async def continue_generation(self) -> None:
                await engine.continue_generation()

        return _Recording()

    def record(self, rollout_id: int, groups: list[Any], trainer: TorchTrainer) -> None:
        self.steps.append((rollout_id, groups, trainer.optimizer_steps))

    def capacity(self, needs: list[set[int]]) -> int:
        """Versions the store must hold: for each step, the loaded versions (in load
        order) from its oldest needed one up to the step itself."""
        put = sorted({k for _, k in self.loaded})
        held = [sum(1 for k in put if min(need) <= k <= i) for i, need in enumerate(needs) if need]
        return max(held, default=1)

    def finish(self, history: list[StepMetrics], trainer: TorchTrainer) -> dict[str, Any] | None:
        from harness.measure.gap_decompose import GapTracker
        from miles_async_core.types import iter_samples

        by_step = {h["rollout_id"]: h for h in history}
        steps = []
        for i, (rollout_id, groups, before) in enumerate(self.steps):
            if rollout_id not in by_step or before != i:
                break  # replay only the steps that trained, in the order they did
            steps.append((rollout_id, [s for g in groups for s in iter_samples(g)]))
        if not steps:
            return None
        to_steps = dict(self.loaded)
        needs = [{to_steps.get(v, -1) for s in samples for v in s.token_versions.versions()} for _, samples in steps]
        capacity = self.capacity(needs)
        tracker = GapTracker(capacity=capacity, model_builder=self.build, temperature=1.0)
        replay = fresh_trainer(self.spec, self.build, self.config)
        loads: dict[int, list[int]] = {}
        for version, k in self.loaded:
            loads.setdefault(k, []).append(version)
        groups_of = {rid: groups for rid, groups, _ in self.steps}
        for i, (rollout_id, samples) in enumerate(steps):
            current = replay.get_weights()
            for version in loads.get(i, []):
                tracker.on_engine_update(version, i, current, copy=False)  # nobody writes to this copy
            scored = [s for s in samples if s.response_tokens]
            if scored:
                by_step[rollout_id].update(
                    tracker.observe(rollout_id, scored, current_weights=current, optimizer_steps=i)
                )
            replay.train_step(groups_of[rollout_id])
        if not tracker.decompositions:
            return None
        diff = None  # a run that stopped early may have trained a step it never reported
        if replay.optimizer_steps == trainer.optimizer_steps:
            diff = max(
                (
                    float((x.float() - y.float()).abs().max())
                    for x, y in zip(replay.get_weights().values(), trainer.get_weights().values())
                ),
                default=0.0,
            )
        return {
            **tracker.summary(),
            "weight_copies_held": capacity,
            "replay_exact": diff == 0.0,
            "replay_max_abs_diff": diff,
        }


class SteppedTrainer:
    """The trainer, reporting each finished step (progress bar) and recording for the gap."""

    def __init__(
        self, trainer: TorchTrainer, on_step: Callable[[StepMetrics], object] | None, gap: GapRecorder | None = None
    ) -> None:
        self.trainer, self.on_step, self.gap = trainer, on_step, gap

    async def train(self, rollout_id: int, groups: list[Any]) -> dict[str, float]:
        if self.gap is not None:
            self.gap.record(rollout_id, groups, self.trainer)
        metrics = await self.trainer.train(rollout_id, groups)
        if self.on_step is not None:
            self.on_step(metrics)
        return metrics

    def get_weights(self) -> Any:
        return self.trainer.get_weights()
