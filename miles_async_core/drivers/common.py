"""Pieces shared by the drivers: the rollout manager, the weight updater, the context.

The core computes no measurement of its own: a ``StepObserver`` injected into the
``RunContext`` (the harness' age recorder) sees each weight update and each trained
batch and returns the figures it wants in the step's history record.

``RolloutManager`` (`miles/ray/rollout/rollout_manager.py`) reads ``weight_version``
once when a generate (drain) starts and refuses a version that goes backwards.
``WeightUpdater`` bumps its version by one per ``update_weights`` and runs the
Megatron sequence pause(mode) -> load weights + version -> continue; the FSDP backend
ignores ``--pause-generation-mode`` and always retracts (`fsdp_utils/update_weight_utils.py:L74`).

A run given a checkpoint folder (``RunContext.checkpoint``, Miles' ``--save``/``--load``)
is one life of a run that may stop and resume: ``start_life`` loads the checkpoint the
way ``miles_async_core.checkpoint`` describes and records the life's start, ``maybe_save``
saves after a training step when ``--save-interval`` or the sentinel says so, and
``debug_exit`` is ``--debug-exit-after-rollout``. Without a checkpoint folder none of
this runs and no event or field of it is recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from miles_async_core import checkpoint as ck
from miles_async_core import events as ev
from miles_async_core.contracts import NullSink, RolloutEngine, Trainer
from miles_async_core.types import iter_samples, samples_of


def weight_version_metrics(groups: list[Any]) -> dict[str, float]:
    """`rollout/weight_version/*` as `miles/ray/rollout/metrics.py:L107-L111` computes them,
    plus this harness' true per-token figures under `rollout/token_version/*`."""
    m: dict[str, float] = {}
    oldest, mixed, token_oldest, token_mixed, old_kv, tokens, count = [], 0, None, 0, 0, 0, 0
    for g in groups:  # one pass: this runs on every step of long simulations
        for s in samples_of(g):
            count += 1
            wv = s.weight_versions
            v = s.oldest_weight_version
            if len(wv) > 1 and len(set(wv)) > 1:
                mixed += 1
            if v is not None:
                oldest.append(v)
            # VersionRuns.oldest, .newest and .old_kv_token_count(), in one pass
            lo: int | None = None
            hi: int | None = None
            for version, kv_version, count_ in s.token_versions.runs:
                if lo is None or hi is None:
                    lo = hi = version
                elif version < lo:
                    lo = version
                elif version > hi:
                    hi = version
                if kv_version < version:
                    old_kv += count_
            if lo is not None:
                token_oldest = lo if token_oldest is None or lo < token_oldest else token_oldest
                token_mixed += lo != hi
            tokens += len(s.response_tokens)
    if oldest and count:
        oldest.sort()
        m["rollout/weight_version/mean"] = sum(oldest) / len(oldest)
        mid = len(oldest) // 2
        m["rollout/weight_version/median"] = oldest[mid] if len(oldest) % 2 else (oldest[mid - 1] + oldest[mid]) / 2
        m["rollout/weight_version/max"] = float(oldest[-1])
        m["rollout/weight_version/min"] = float(oldest[0])
        m["rollout/weight_version/mixed_version_ratio"] = mixed / count
    if token_oldest is not None:
        m["rollout/token_version/min"] = float(token_oldest)
        m["rollout/token_version/mixed_ratio"] = token_mixed / count
        m["rollout/token_version/old_kv_token_share"] = old_kv / max(1, tokens)
    return m


class RolloutManager:
    def __init__(self, rollout_fn: Any, *, sink: Any = None) -> None:
        self.rollout_fn = rollout_fn
        self.sink = sink or NullSink()
        self.weight_version: int | None = None

    def set_weight_version(self, version: int) -> None:
        if self.weight_version is not None and version < self.weight_version:
            raise RuntimeError(f"Engine weight version went backwards: {self.weight_version} -> {version}")
        self.weight_version = version
        if self.sink.enabled:
            self.sink.emit(ev.SET_WEIGHT_VERSION, version=version)

    def launch(self, rollout_id: int) -> "asyncio.Future[tuple[list[Any], dict[str, Any]]]":
        """Start a generate now (``generate.remote``): the version is read at launch."""
        version = self.weight_version  # read once, when the drain starts (rollout_manager.py:L252)
        if self.sink.enabled:
            self.sink.emit(ev.GENERATE_START, rollout_id=rollout_id, version=version)
        return asyncio.ensure_future(self._generate(rollout_id, version))

    async def generate(self, rollout_id: int) -> tuple[list[Any], dict[str, Any]]:
        return await self.launch(rollout_id)

    async def _generate(self, rollout_id: int, version: int | None) -> tuple[list[Any], dict[str, Any]]:
        data, metrics = await self.rollout_fn(rollout_id, version)
        metrics = {**metrics, **weight_version_metrics(data)}
        if self.sink.enabled:
            self.sink.emit(ev.GENERATE_END, rollout_id=rollout_id)
            self.sink.emit(ev.METRICS, rollout_id=rollout_id, metrics=metrics)
        return data, metrics


class StepObserver(Protocol):
    """Measurement hooks; the core only calls them (``harness.measure.ages`` implements one)."""

    def on_weights_updated(self, ctx: "RunContext", version: int) -> None: ...

    def on_train_batch(self, ctx: "RunContext", rollout_id: int, data: list[Any]) -> dict[str, Any]: ...


@dataclass
class RunContext:
    args: Any
    engine: RolloutEngine
    trainer: Trainer
    rollout_manager: RolloutManager
    sink: Any = field(default_factory=NullSink)
    observer: StepObserver | None = None
    weight_version: int = 0  # the updater's counter (mixin.py:L358): one per weight update
    history: list[dict[str, Any]] = field(default_factory=list)  # one record per finished train step
    worker_error: BaseException | None = None  # a fully-async worker that died after the last drain
    pending_generate: Any = None  # a generate launched and not yet awaited (left running if a step raises)
    data_source: Any = None  # the rollout's data source (make_context sets it)
    # ---- lives: set only for a run given a checkpoint folder ---------------------------
    checkpoint: ck.CheckpointDir | None = None  # --save / --load
    save_sentinel: Callable[[int], bool] | None = None  # --save-trigger-sentinel exists after rollout N
    optimizer_step: int = 0  # the trainer's optimizer steps, across lives (restored from the checkpoint)
    lr_step: int = 0  # the learning-rate scheduler's steps, across lives
    steps_at_update: int = 0  # trainer_steps at the last weight update

    @property
    def trainer_steps(self) -> int:
        """Optimizer steps taken so far: one per finished train step."""
        return len(self.history)

    def phase(self, side: str, phase: str, start: bool, **extra: Any) -> None:
        if self.sink.enabled:
            self.sink.emit(ev.PHASE_START if start else ev.PHASE_END, side=side, phase=phase, **extra)


async def update_weights(ctx: RunContext) -> int:
    """One weight update: pause with the configured mode, load, bump the version, resume."""
    args = ctx.args
    mode = "retract" if args.train_backend == "fsdp" else args.pause_generation_mode
    ctx.weight_version += 1
    ctx.steps_at_update = ctx.trainer_steps
    ctx.phase("train", "weight_sync", True, version=ctx.weight_version)
    await ctx.engine.pause_generation(mode)
    await ctx.engine.update_weights(ctx.weight_version, ctx.trainer.get_weights())
    if ctx.observer is not None:
        ctx.observer.on_weights_updated(ctx, ctx.weight_version)
    if ctx.sink.enabled:
        ctx.sink.emit(ev.ENGINE_VERSION, version=ctx.weight_version, trainer_steps=ctx.trainer_steps)
    await ctx.engine.continue_generation()
    ctx.rollout_manager.set_weight_version(ctx.weight_version)
    ctx.phase("train", "weight_sync", False, version=ctx.weight_version)
    return ctx.weight_version


async def train_step(ctx: RunContext, rollout_id: int, data: list[Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """Train on one batch; under ``--colocate`` generation stops for the whole window."""
    colocate_pause = ctx.args.colocate  # engine and trainer share the device: generation stops
    if colocate_pause:
        await ctx.engine.pause_generation(ctx.args.pause_generation_mode)
    observed = ctx.observer.on_train_batch(ctx, rollout_id, data) if ctx.observer is not None else {}
    ctx.phase("train", "training", True, rollout_id=rollout_id)
    group_indices = [next(iter_samples(g)).group_index for g in data]
    if ctx.sink.enabled:
        steps = {} if ctx.checkpoint is None else {"optimizer_step": ctx.optimizer_step, "lr_step": ctx.lr_step}
        ctx.sink.emit(
            ev.TRAINED,
            rollout_id=rollout_id,
            group_indices=group_indices,
            trainer_version=ctx.weight_version,
            trainer_steps=ctx.trainer_steps,
            **steps,
        )
    steps_before = ctx.trainer_steps
    train_metrics = await ctx.trainer.train(rollout_id, data)
    ctx.optimizer_step += 1
    ctx.lr_step += 1
    if ctx.checkpoint is not None and ctx.data_source is not None:
        ctx.data_source.mark_trained(group_indices)
    ctx.phase("train", "training", False, rollout_id=rollout_id)
    if colocate_pause:
        await ctx.engine.continue_generation()
    record = {
        "rollout_id": rollout_id,
        "trainer_version": ctx.weight_version,
        "trainer_steps": steps_before,
        **observed,
        **metrics,
        **(train_metrics or {}),
    }
    ctx.history.append(record)
    return record


# ---- lives: checkpoint, resume, planned exit ------------------------------------------------


def start_life(ctx: RunContext, life: int) -> ck.Loaded:
    """Load the checkpoint a new life starts from (``miles_async_core.checkpoint``): the
    trainer's state and steps, the data source's state, ``start_rollout_id``; under
    ``exactly_once_resume`` the updater's version, so the first update serves the
    checkpoint's version. Records ``life_start`` and ``checkpoint_loaded``."""
    assert ctx.checkpoint is not None, "start_life needs a checkpoint folder (RunContext.checkpoint)"
    exactly_once = bool(getattr(ctx.args, "exactly_once_resume", False))
    loaded = ck.find(ctx.checkpoint, exactly_once=exactly_once)
    if loaded.model is not None:
        load_state = getattr(ctx.trainer, "load_state_dict", None)
        if load_state is not None:
            load_state(loaded.model["trainer"])
        ctx.optimizer_step, ctx.lr_step = int(loaded.model["optimizer_step"]), int(loaded.model["lr_step"])
        if exactly_once:
            ctx.weight_version = int(loaded.model["version"]) - 1  # the first update serves the checkpoint's
    if loaded.data_source is not None and ctx.data_source is not None:
        ctx.data_source.load(loaded.data_source)
    ctx.args = dataclasses.replace(ctx.args, start_rollout_id=loaded.start_rollout_id)
    if ctx.sink.enabled:
        ctx.sink.emit(ev.LIFE_START, life=life, start_rollout_id=loaded.start_rollout_id, loaded_version=loaded.version)
    ck.emit_loaded(loaded, ctx.sink)
    return loaded


async def maybe_save(ctx: RunContext, rollout_id: int) -> None:
    """After training ``rollout_id``: save if ``--save-interval`` or the sentinel says so."""
    if ctx.checkpoint is None:
        return
    sentinel = ctx.save_sentinel is not None and ctx.save_sentinel(rollout_id)
    if not ck.should_save(ctx.args, rollout_id, sentinel):
        return
    state = getattr(ctx.trainer, "state_dict", None)
    model = {
        "rollout_id": rollout_id,
        "optimizer_step": ctx.optimizer_step,
        "lr_step": ctx.lr_step,
        "version": ck.saved_version(ctx.weight_version, ctx.trainer_steps > ctx.steps_at_update),
        "trainer": state() if state is not None else None,
    }
    await ck.save(
        ctx.checkpoint,
        rollout_id,
        model=model,
        data_source=ctx.data_source,
        sink=ctx.sink,
        exactly_once=bool(getattr(ctx.args, "exactly_once_resume", False)),
    )


def debug_exit(ctx: RunContext, rollout_id: int) -> bool:
    """``--debug-exit-after-rollout N``: this life ends after N rollouts (train.py:L139-L148)."""
    n = getattr(ctx.args, "debug_exit_after_rollout", None)
    return ctx.checkpoint is not None and n is not None and rollout_id - ctx.args.start_rollout_id + 1 >= n
