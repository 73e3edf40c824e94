"""Real runs: the core's drivers on the torch engine and trainer, in a process layout.

Layouts:

* ``split``: the engine's ``EngineCore`` runs in its own process (``ProcessEngine``),
  the trainer and the driver in this one, each process pinned to ``threads`` torch
  threads, weights through shared memory. Rollout and training truly run at once.
* ``colocate``: one process; the engine runs in a thread (``TorchEngine``) and the
  config gets ``colocate=True``, so generation stops for the whole training window.

``run_mode`` runs one mode (``sync`` = ``train.py``, ``one-step`` = ``train_async.py``,
``fully-async`` = ``train_async.py --fully-async``) with a fresh model built from the
same seed, records the trace on the real clock, and returns a ``ModeResult``. A run that
fails keeps every finished step in its result (``error`` says what happened).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from miles_async_core import events as ev
from harness.backends.tasks import get_task
from harness.backends.torch_trainer import TorchTrainer, TrainerConfig
from miles_async_core.config import AsyncConfig
from miles_async_core.drivers import make_context, run
from miles_async_core.errors import ConfigError
from miles_async_core.rules import validate
from miles_async_core.types import SamplingParams
from harness.measure.ages import AgeRecorder
from harness.measure.overlap import ideal_speedup, measurement_window, overlap_metrics
from harness.sim.simulate import histogram
from harness.trace import TraceRecorder

MODES: dict[str, dict[str, Any]] = {
    "sync": {"driver": "train", "fully_async": False},
    "one-step": {"driver": "train_async", "fully_async": False},
    "fully-async": {"driver": "train_async", "fully_async": True},
}
LAYOUTS = ("split", "colocate")


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """The main job's settings. These defaults are the only ones: ``miles-harness run``'s
    flags take theirs from here (``harness.commands.run.RUNSPEC_FLAGS``), so ``make run``
    with no arguments runs ``RunSpec()``."""

    layout: str = "split"
    model: str = "tiny"
    task: str = "copy"
    steps: int = 30
    lr: float = 3e-3
    lr_scaling: str = "none"
    use_tis: bool = False
    tis_clip: float = 2.0
    seed: int = 0
    threads: int = 1
    max_running: int = 16  # the engine's continuous-batching width (requests)
    tiny_d_model: int = 256
    tiny_layers: int = 4
    profile: str = "manual"
    device: str = "cpu"
    task_length: int | None = 3  # copy task only: symbols to copy (longer -> more decode steps); None: the task's own
    gap_decomposition: bool = True  # per-step kernel / staleness gap, computed after the timed run

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda") or (self.device == "cuda" and not torch.cuda.is_available()):
            raise ConfigError(f"--device {self.device!r}: allowed cpu, cuda (cuda needs a CUDA build of torch and a "
                              "GPU); fix: --device cpu")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--layout {self.layout!r}: allowed {', '.join(LAYOUTS)}; fix: pick one of them")
        if self.steps < 2:
            raise ConfigError(f"--steps {self.steps}: must be >= 2 to compare start and end; fix: e.g. --steps 30")


@dataclass
class ModeResult:
    mode: str
    config: AsyncConfig
    history: list[dict]
    events: list[Any]
    window: tuple[float, float]
    overlap: dict[str, float]
    engine_sync: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    gap_summary: dict[str, Any] | None = None
    worker_error: str | None = None  # a fully-async worker that died after the last drain

    def per_step(self, key: str) -> list[float]:
        return [r[key] for r in self.history if key in r]

    @classmethod
    def from_trace(cls, mode: str, config: AsyncConfig, history: list[dict], events: list[Any], t0: float,
                   t1: float, **extra: Any) -> ModeResult:
        """A mode's result from its trace: window and overlap measured by
        ``harness.measure.overlap`` (the definition ``simulate`` reports too)."""
        window = measurement_window(events, t0, t1)
        return cls(mode=mode, config=config, history=history, events=events, window=window,
                   overlap=overlap_metrics(events, window), **extra)


def mode_config(mode: str, base: AsyncConfig, spec: RunSpec) -> AsyncConfig:
    if mode not in MODES:
        raise ConfigError(f"--modes: unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    overrides = dict(MODES[mode], num_rollout=spec.steps, seed=spec.seed)
    if spec.layout == "colocate":
        overrides["colocate"] = True
    config = dataclasses.replace(base, **overrides)
    errors = [v for v in validate(config, spec.profile) if v.severity == "error"]
    if errors:
        raise ConfigError(f"mode {mode} on the {spec.layout} layout is refused by rule profile {spec.profile!r}: "
                          + "; ".join(f"[{v.rule_id}] {v.message}" for v in errors))
    return config


def build_model_factory(spec: RunSpec, task: Any) -> Callable[[], Any]:
    """A picklable zero-argument builder (the engine process calls it too)."""
    if spec.model == "tiny":
        from harness.backends.torch_models import TinyLMConfig, build_tiny_lm

        cfg = TinyLMConfig(vocab_size=task.tokenizer.vocab_size, d_model=spec.tiny_d_model,
                           n_layers=spec.tiny_layers, d_ff=spec.tiny_d_model * 11 // 4, seed=spec.seed)
        return functools.partial(build_tiny_lm, cfg, device=spec.device)
    if spec.model == "smollm2":
        from harness.backends.torch_models import load_smollm2

        return functools.partial(load_smollm2, device=spec.device)
    from harness.backends.torch_models import load_hf_dir

    return functools.partial(load_hf_dir, spec.model, device=spec.device)


def _prompt_fn(task: Any, seed: int) -> Callable[[int], tuple[str, list[int], Any]]:
    def prompt(k: int) -> tuple[str, list[int], Any]:
        s = task.sample_prompts(random.Random(seed * 1_000_003 + k), 1)[0]
        return s.prompt, s.prompt_tokens, s.label

    return prompt


def run_mode(mode: str, base: AsyncConfig, spec: RunSpec, *, on_step: Callable[[dict], None] | None = None
             ) -> ModeResult:
    config = mode_config(mode, base, spec)
    task = get_task(spec.task, **({"length": spec.task_length} if spec.task_length and spec.task == "copy" else {}))
    build = build_model_factory(spec, task)
    torch.manual_seed(spec.seed)
    torch.set_num_threads(spec.threads)
    model = build()
    trainer = TorchTrainer(model, TrainerConfig(
        lr=spec.lr, lr_scaling=spec.lr_scaling, update_weights_interval=config.update_weights_interval,
        max_weight_staleness=config.max_weight_staleness or 0, use_tis=spec.use_tis, tis_clip=spec.tis_clip))
    holder: dict[str, Any] = {}
    gap = _GapRecorder(spec, build) if spec.gap_decomposition else None
    if gap is not None:
        gap.prepare(trainer)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time)
        holder["sink"] = sink
        engine = _make_engine(spec, build, trainer, task, sink)
        holder["engine"] = engine
        if gap is not None:
            engine = gap.wrap_engine(engine, trainer)
        ctx = make_context(config, engine, _Stepped(trainer, on_step, gap), _prompt_fn(task, spec.seed),
                           sampling=SamplingParams(max_new_tokens=task.max_new_tokens, temperature=1.0),
                           reward_fn=task.reward, sink=sink, observer=AgeRecorder())
        holder["ctx"] = ctx
        holder["t0"] = loop.time()
        try:
            await run(ctx)
        finally:
            holder["t1"] = loop.time()
            await _close(engine)

    error = None
    try:
        asyncio.run(main())
    except Exception as exc:  # finished steps are kept; the caller reports the error
        error = f"{type(exc).__name__}: {exc}"
    ctx, sink = holder.get("ctx"), holder.get("sink")
    events = sink.events if sink else []
    engine = holder.get("engine")
    history = ctx.history if ctx else []
    gap_summary = gap.finish(history) if gap is not None else None
    worker_error = getattr(ctx, "worker_error", None)
    return ModeResult.from_trace(
        mode, config, history, events, holder.get("t0", 0.0), holder.get("t1", 0.0), error=error,
        engine_sync=list(getattr(engine, "sync_s", [])), gap_summary=gap_summary,
        worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None)


class _GapRecorder:
    """Keeps what the trainer-engine gap decomposition needs (every engine version's
    weights, and per step the samples and the weights about to be trained) and computes
    it after the run, so the extra forward passes never distort the timed overlap."""

    def __init__(self, spec: RunSpec, build: Callable[[], Any]) -> None:
        from harness.measure.gap_decompose import GapTracker

        self.tracker = GapTracker(capacity=spec.steps + 2, model_builder=build, temperature=1.0)
        self.steps: list[tuple[int, list[Any], dict[str, Any], int]] = []
        self._buffers: list[dict[str, Any]] = []

    def prepare(self, trainer: TorchTrainer) -> None:
        """Before the timed run: allocate and touch one buffer per weight version the run
        keeps. Fresh copies inside the run page-faulted ever more memory and stretched
        the weight-sync phase from ~10 ms to ~80 ms per step on the default model."""
        template = trainer.get_weights()
        self._buffers = [{k: torch.zeros_like(v) for k, v in template.items()} for _ in range(self.tracker.store.capacity)]

    def weights_copy(self, trainer: TorchTrainer) -> dict[str, Any]:
        return trainer.get_weights(self._buffers.pop()) if self._buffers else trainer.get_weights()

    def wrap_engine(self, engine: Any, trainer: TorchTrainer) -> Any:
        tracker = self.tracker

        class _Recording:
            def __getattr__(self, name: str) -> Any:
                return getattr(engine, name)

            def generate(self, sample: Any, sampling: Any) -> Any:
                return engine.generate(sample, sampling)

            async def pause_generation(self, mode: str) -> None:
                await engine.pause_generation(mode)

            async def update_weights(self, version: int, weights: Any) -> None:
                await engine.update_weights(version, weights)
                # the driver's fresh get_weights() copy: kept as is, not copied again
                tracker.on_engine_update(version, trainer.optimizer_steps, weights, copy=False)

            async def continue_generation(self) -> None:
                await engine.continue_generation()

        return _Recording()

    def record(self, rollout_id: int, groups: list[Any], trainer: TorchTrainer) -> None:
        from miles_async_core.types import iter_samples

        samples = [s for g in groups for s in iter_samples(g) if s.response_tokens]
        # The weights about to be trained were usually just loaded into the engine (and
        # stored): reuse that copy; copying again inside the timed run slowed each step.
        steps, store = trainer.optimizer_steps, self.tracker.store
        weights = store.get(steps) if steps in store else trainer.get_weights()
        self.steps.append((rollout_id, samples, weights, steps))

    def finish(self, history: list[dict]) -> dict[str, Any] | None:
        by_step = {h["rollout_id"]: h for h in history}
        for rollout_id, samples, weights, steps in self.steps:
            if rollout_id in by_step and samples:
                by_step[rollout_id].update(self.tracker.observe(rollout_id, samples, current_weights=weights,
                                                                optimizer_steps=steps))
        return self.tracker.summary() if self.tracker.decompositions else None


class _Stepped:
    """The trainer, reporting each finished step (progress bar) and recording for the gap."""

    def __init__(self, trainer: TorchTrainer, on_step: Callable[[dict], None] | None,
                 gap: _GapRecorder | None = None) -> None:
        self.trainer, self.on_step, self.gap = trainer, on_step, gap

    async def train(self, rollout_id: int, groups: list[Any]) -> dict[str, float]:
        if self.gap is not None:
            self.gap.record(rollout_id, groups, self.trainer)
        metrics = await self.trainer.train(rollout_id, groups)
        if self.on_step is not None:
            self.on_step(metrics)
        return metrics

    def get_weights(self) -> Any:
        return self.gap.weights_copy(self.trainer) if self.gap is not None else self.trainer.get_weights()


def _make_engine(spec: RunSpec, build: Callable[[], Any], trainer: TorchTrainer, task: Any, sink: Any) -> Any:
    if spec.layout == "split":
        from harness.backends.process_engine import ProcessEngine

        return ProcessEngine(build, trainer.get_weights(), max_running=spec.max_running,
                             eos_token_id=task.eos_token_id, seed=spec.seed, num_threads=spec.threads, sink=sink,
                             max_seq_len=trainer.model.max_seq_len)
    from harness.backends.torch_engine import EngineCore, TorchEngine

    engine_model = build()
    core = EngineCore(engine_model, max_running=spec.max_running, eos_token_id=task.eos_token_id)
    return _BusyReporting(TorchEngine(core, seed=spec.seed, sink=sink), sink)


class _BusyReporting:
    """Colocated engine: the rollout side is busy from the first request until its queue
    drains or it is paused (measured at the adapter, in the same process)."""

    def __init__(self, engine: Any, sink: Any) -> None:
        self.engine, self.sink, self.in_flight, self.busy = engine, sink, 0, False
        self.paused = False

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _set(self, busy: bool) -> None:
        if busy != self.busy:
            self.busy = busy
            self.sink.emit(ev.PHASE_START if busy else ev.PHASE_END, side="rollout", phase="generating")

    def generate(self, sample: Any, sampling: Any) -> Any:
        fut = self.engine.generate(sample, sampling)
        self.in_flight += 1
        self._set(not self.paused)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: Any) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._set(False)

    async def pause_generation(self, mode: str) -> None:
        await self.engine.pause_generation(mode)
        self.paused = True
        self._set(False)

    async def update_weights(self, version: int, weights: Any) -> None:
        await self.engine.update_weights(version, weights)

    async def continue_generation(self) -> None:
        await self.engine.continue_generation()
        self.paused = False
        self._set(self.in_flight > 0)

    def close(self) -> None:
        self.engine.close()


async def _close(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if close is not None:
        await asyncio.to_thread(close)


def summarize_mode(r: ModeResult, sync: ModeResult | None) -> dict[str, Any]:
    """One row of the main job's table."""
    rewards = r.per_step("train/reward_mean")
    k = max(1, min(3, len(rewards) // 4))
    ages = [a for h in r.history for a in h.get("age_versions", [])]
    lags = [a for h in r.history for a in h.get("lag_steps", [])]
    taken = sum(1 for e in r.events if e.kind == ev.TAKEN)
    dropped = sum(1 for e in r.events if e.kind == ev.DROPPED)
    retried = sum(1 for e in r.events if e.kind == ev.RECYCLED)
    row: dict[str, Any] = {
        "mode": r.mode, "steps": len(r.history), "wall_s": r.overlap["wall_s"],
        "reward_start": sum(rewards[:k]) / k if rewards else None,
        "reward_end": sum(rewards[-k:]) / k if rewards else None,
        "age_hist": histogram(ages), "lag_hist": histogram(lags),
        "dropped_share": dropped / taken if taken else 0.0, "retried_share": retried / taken if taken else 0.0,
        "lr": r.per_step("train/lr")[-1] if r.per_step("train/lr") else None,
        "error": r.error, "worker_error": r.worker_error, **{k2: v for k2, v in r.overlap.items() if k2 != "wall_s"},
    }
    if sync is not None and sync.history and r.history and r is not sync:
        per_step_sync = sync.overlap["wall_s"] / len(sync.history)
        per_step = r.overlap["wall_s"] / len(r.history)
        R = sync.overlap["rollout_busy_s"] / len(sync.history)
        T = (sync.overlap["train_busy_s"] + sync.overlap["weight_sync_s"]) / len(sync.history)
        ideal = ideal_speedup(R, T)
        row.update(speedup=per_step_sync / per_step, ideal_speedup=ideal,
                   overlap_efficiency=(per_step_sync / per_step) / ideal, sync_rollout_s=R, sync_train_s=T)
    return row
