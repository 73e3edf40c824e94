"""Real runs: the core's drivers on the torch engine and trainer, in a process layout.

Layouts:

* ``split``: the engine's ``EngineCore`` runs in its own process (``ProcessEngine``),
  the trainer and the driver in this one, each process pinned to ``threads`` torch
  threads, weights through shared memory. Rollout and training truly run at once.
* ``colocate``: one process; the engine runs in a thread (``TorchEngine``) and the
  config gets ``colocate=True``, so generation stops for the whole training window.
* ``ray``: ``num_engines`` engines as Ray actors behind one ``RayEngineGroup``
  (``harness.backends.ray_engine``: least-outstanding router, weights broadcast through
  the object store, pause / update / resume on every engine); the trainer and the driver
  in this process. Ray start-up and actor start-up happen before ``t0`` and are reported
  in ``ModeResult.engine_stats["startup"]``.

``run_mode`` runs one mode (``sync`` = ``train.py``, ``one-step`` = ``train_async.py``,
``fully-async`` = ``train_async.py --fully-async``) with a fresh model built from the
same seed, records the trace on the real clock, and returns a ``ModeResult``. A run that
fails keeps every finished step in its result (``error`` says what happened).

What the harness computes for itself stays out of the timed window (``t0`` .. ``t1``,
the driver's ``run``): the trace records events as they happen (the run ends with
``RUN_END``, listing what is still pending, so ``conservation`` can close), and after
``t1`` every applicable invariant checker runs on the trace (``ModeResult.checks``) and
the per-step gap decomposition is computed by replaying the recorded training batches
(``_GapRecorder``). ``run_mode(..., measure=False)`` runs with none of it (no trace, no
age observer, no gap, no checks): ``suites/bench/test_measurement_cost.py`` compares the
two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch

from miles_async_core import events as ev
from harness.backends.tasks import get_task
from harness.backends.ray_engine import BROADCASTS
from harness.backends.torch_trainer import LR_SCALINGS, TorchTrainer, TrainerConfig
from miles_async_core.config import AsyncConfig
from miles_async_core.drivers import make_context, run
from miles_async_core.errors import ConfigError
from miles_async_core.rules import validate
from miles_async_core.types import SamplingParams
from harness.measure.ages import AgeRecorder
from harness.measure import cpu_use
from harness.measure.memory import PeakRss, read_peak_rss_bytes
from harness.measure.self_cost import SelfCost
from harness.measure.overlap import ideal_speedup, measurement_window, overlap_metrics
from harness.results.mode_rows import SPREAD_KEYS, ModeRow
from harness.sim.run_scenario import emit_run_end, histogram
from harness.trace import TraceRecorder
from miles_async_core.contracts import NullSink

MODES: dict[str, dict[str, Any]] = {
    "sync": {"driver": "train", "fully_async": False},
    "one-step": {"driver": "train_async", "fully_async": False},
    "fully-async": {"driver": "train_async", "fully_async": True},
}
LAYOUTS = ("split", "colocate", "ray")


def _flag(default: Any, help_text: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None,
          value_type: Callable[[str], Any] | None = None) -> Any:
    """A ``RunSpec`` field and its ``miles-harness run`` flag: ``flag`` (default: the field's
    name as ``--name-with-dashes``), ``help_text``, ``choices`` (checked by ``RunSpec``
    itself, so a bad value is a ``ConfigError`` naming the flag) and ``value_type`` (default:
    the default's type; a bool field is a switch that turns its default over)."""
    if value_type is None and default is not None:
        value_type = type(default)
    return field(default=default, metadata={"flag": flag, "help": help_text, "choices": choices,
                                            "type": value_type})


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """The main job's settings, and the one definition of ``miles-harness run``'s flags
    (``harness.commands.run`` builds its parser from these fields' metadata), so ``make
    run`` with no arguments runs ``RunSpec()``."""

    layout: str = _flag("split", "split (engine in its own process), colocate, or ray (--num-engines engines "
                        "as Ray actors)", choices=LAYOUTS)
    model: str = _flag("tiny", "tiny (built from a config), smollm2 (needs the model extra), or a local Hugging "
                       "Face model directory")
    task: str = _flag("copy", "copy (tiny model learns it) or arithmetic (for SmolLM2)")
    steps: int = _flag(40, "training steps per mode")
    # 3e-3 collapsed the copy policy to a prompt-blind constant (reward at chance)
    lr: float = _flag(1e-3, "learning rate")
    lr_scaling: str = _flag("none", "the seed's LR rule", choices=LR_SCALINGS)
    use_tis: bool = _flag(False, "truncated importance sampling on the rollout log-probs")
    tis_clip: float = _flag(2.0, "TIS weight clip")
    seed: int = _flag(0, "seed of the model, the prompts and the sampling")
    threads: int = _flag(1, "torch threads per process")
    max_running: int = _flag(16, "engine's continuous-batching width (requests)")
    tiny_d_model: int = _flag(256, "tiny model width", flag="--d-model")
    tiny_layers: int = _flag(4, "tiny model depth", flag="--layers")
    profile: str = _flag("manual", "rule profile: manual (the seed manual) or the pinned upstream Miles "
                         "profile (miles-<pinned commit>; miles_async_core.rules.PROFILES)")
    device: str = _flag("cpu", "where the engine and trainer models live (cuda needs a CUDA build of torch and a "
                        "GPU)", choices=("cpu", "cuda"))
    # copy task only (None: the task's own); longer -> more decode steps; chance level 1 / task_symbols
    task_length: int | None = _flag(2, "copy task: symbols to copy", value_type=int)
    task_symbols: int | None = _flag(4, "copy task: alphabet size (1-8); chance level is 1 / this", value_type=int)
    repeats: int = _flag(2, "interleaved repeats of the modes (sync, one-step, fully-async, sync, ...); the "
                         "table reports medians and min-max")
    gap_decomposition: bool = _flag(True, "skip the per-step kernel / staleness gap decomposition (computed after "
                                    "the timed run)", flag="--no-gap")
    num_engines: int = _flag(2, "ray layout: rollout engines (Ray actors)")
    ray_address: str | None = _flag(None, "ray layout: join this Ray cluster (default: start a local one sized to "
                                    "the machine)", value_type=str)
    broadcast: str = _flag("put_once", "ray layout: weights to the engines by one ray.put (put_once) or one "
                           "argument per engine", choices=BROADCASTS)

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed = f.metadata["choices"]
            if allowed and getattr(self, f.name) not in allowed:
                raise ConfigError(f"{flag_of(f)} {getattr(self, f.name)!r}: allowed {', '.join(allowed)}; fix: pick "
                                  "one of them")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device!r}: allowed cpu, cuda (cuda needs a CUDA build of torch and a "
                              "GPU); fix: --device cpu")
        if self.steps < 2:
            raise ConfigError(f"--steps {self.steps}: must be >= 2 to compare start and end; fix: e.g. --steps 40")
        if self.repeats < 1:
            raise ConfigError(f"--repeats {self.repeats}: must be >= 1; fix: e.g. --repeats 3")
        if self.num_engines < 1 or (self.num_engines != 2 and self.layout != "ray"):
            raise ConfigError(f"--num-engines {self.num_engines}: must be >= 1, and only the ray layout runs more "
                              "than one engine; fix: --layout ray --num-engines N")

    def task_kwargs(self) -> dict[str, Any]:
        """``get_task`` arguments: length and alphabet apply to the copy task only."""
        if self.task != "copy":
            return {}
        return {k: v for k, v in (("length", self.task_length), ("n_symbols", self.task_symbols)) if v}


def flag_of(f: Any) -> str:
    """The ``miles-harness run`` flag of a ``RunSpec`` field."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


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
    checks: dict[str, Any] | None = None  # harness.checking.invariants.check_report of the trace (None: not checked)
    chance_level: float | None = None  # the task's: best prompt-blind policy's expected reward
    run_s: float = 0.0  # the driver's run, t1 - t0 (what measure=False times too)
    engine_stats: dict | None = None  # ray layout: RayEngineGroup.stats() (per engine, start-up, broadcast)
    self_cost: dict | None = None  # harness.measure.self_cost: the recording's own time inside t0 .. t1
    peak_rss_bytes: dict = field(default_factory=dict)  # harness.measure.memory: run, after_run, engine_process
    run_cpu_s: float | None = None  # CPU seconds of t0 .. t1, this process + the split engine process
    cpu_use: dict | None = None  # harness.measure.cpu_use.cores over t0 .. t1: cores per process and in total

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
        # upstream's train_async.py refuses --colocate; the seed manual's colocated
        # fully-async mode is the harness extension allow_async_colocate
        overrides["allow_async_colocate"] = MODES[mode]["driver"] == "train_async"
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


def _trainer(spec: RunSpec, build: Callable[[], Any], config: AsyncConfig) -> TorchTrainer:
    """A fresh trainer on a fresh model: the same weights for every mode and for the gap replay."""
    torch.manual_seed(spec.seed)
    torch.set_num_threads(spec.threads)
    return TorchTrainer(build(), TrainerConfig(
        lr=spec.lr, lr_scaling=spec.lr_scaling, update_weights_interval=config.update_weights_interval,
        max_weight_staleness=config.max_weight_staleness or 0, use_tis=spec.use_tis, tis_clip=spec.tis_clip))


def run_mode(mode: str, base: AsyncConfig, spec: RunSpec, *, on_step: Callable[[dict], None] | None = None,
             measure: bool = True, gap: bool | None = None) -> ModeResult:
    """One mode's run. ``measure=False``: no trace, no age observer, no gap and no checks
    (only ``run_s`` and the history are meaningful). ``gap`` overrides
    ``spec.gap_decomposition`` (the main job decomposes the first repeat only)."""
    config = mode_config(mode, base, spec)
    task = get_task(spec.task, **spec.task_kwargs())
    build = build_model_factory(spec, task)
    trainer = _trainer(spec, build, config)
    holder: dict[str, Any] = {}
    cost = SelfCost()
    memory = PeakRss()
    memory.start("run")  # model builds and the timed run; "after_run": the gap replay and the checkers
    recorder = _GapRecorder(spec, build, config) if measure and (spec.gap_decomposition if gap is None else gap) \
        else None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        holder["sink"] = recorded = TraceRecorder(loop.time) if measure else None
        sink = cost.sink(recorded) if measure else NullSink()
        engine = _make_engine(spec, build, trainer, task, sink)
        holder["engine"] = engine
        if recorder is not None:
            engine = recorder.wrap_engine(engine, trainer)
        ctx = make_context(config, engine, _Stepped(trainer, on_step, recorder), _prompt_fn(task, spec.seed),
                           sampling=SamplingParams(max_new_tokens=task.max_new_tokens, temperature=1.0),
                           reward_fn=task.reward, sink=sink,
                           observer=cost.observer(AgeRecorder()) if measure else None)
        holder["ctx"] = ctx
        child = getattr(getattr(engine, "process", None), "pid", None)  # the split layout's engine process
        engine_pids = [child] if child is not None else _engine_pids(holder["engine"])
        use0 = cpu_use.snapshot(engine_pids)
        holder["t0"] = loop.time()
        try:
            await run(ctx)
        finally:
            holder["t1"] = loop.time()
            use1 = cpu_use.snapshot(engine_pids)
            holder["cpu_use"] = cpu_use.cores(use0, use1, holder["t1"] - holder["t0"])
            holder["run_cpu_s"] = _run_cpu_s(use0, use1, split=child is not None)
            emit_run_end(ctx)  # a no-op on the NullSink
            holder["engine_peak"] = read_peak_rss_bytes(child) if child is not None else None
            await _close(engine)

    error = None
    try:
        asyncio.run(main())
    except Exception as exc:  # finished steps are kept; the caller reports the error
        error = f"{type(exc).__name__}: {exc}"
    ctx, sink = holder.get("ctx"), holder.get("sink")
    events = sink.events if sink is not None else []
    engine = holder.get("engine")
    history = ctx.history if ctx else []
    # after t1: nothing below is timed
    memory.start("after_run")
    gap_summary = recorder.finish(history, trainer) if recorder is not None else None
    checks = None
    if measure:
        from harness.checking.invariants import check_report

        checks = check_report(events, config, complete=error is None)
    worker_error = getattr(ctx, "worker_error", None)
    t0, t1 = holder.get("t0", 0.0), holder.get("t1", 0.0)
    peaks = {**memory.stop(), "engine_process": holder.get("engine_peak")}
    return ModeResult.from_trace(
        mode, config, history, events, t0, t1, error=error,
        engine_sync=list(getattr(engine, "sync_s", [])), gap_summary=gap_summary, checks=checks,
        chance_level=task.chance_level, run_s=t1 - t0, self_cost=cost.summary(t1 - t0) if measure else None,
        peak_rss_bytes=peaks,
        run_cpu_s=holder.get("run_cpu_s"), cpu_use=holder.get("cpu_use"),
        engine_stats=engine.stats() if hasattr(engine, "stats") else None,
        worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None)


class _GapRecorder:
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

    def __init__(self, spec: RunSpec, build: Callable[[], Any], config: AsyncConfig) -> None:
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

    def finish(self, history: list[dict], trainer: TorchTrainer) -> dict[str, Any] | None:
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
        needs = [{to_steps.get(v, -1) for s in samples for v in s.token_versions.versions()}
                 for _, samples in steps]
        capacity = self.capacity(needs)
        tracker = GapTracker(capacity=capacity, model_builder=self.build, temperature=1.0)
        replay = _trainer(self.spec, self.build, self.config)
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
                by_step[rollout_id].update(tracker.observe(rollout_id, scored, current_weights=current,
                                                           optimizer_steps=i))
            replay.train_step(groups_of[rollout_id])
        if not tracker.decompositions:
            return None
        diff = None  # a run that stopped early may have trained a step it never reported
        if replay.optimizer_steps == trainer.optimizer_steps:
            diff = max((float((x.float() - y.float()).abs().max()) for x, y in
                        zip(replay.get_weights().values(), trainer.get_weights().values())), default=0.0)
        return {**tracker.summary(), "weight_copies_held": capacity, "replay_exact": diff == 0.0,
                "replay_max_abs_diff": diff}


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
        return self.trainer.get_weights()


def _make_engine(spec: RunSpec, build: Callable[[], Any], trainer: TorchTrainer, task: Any, sink: Any) -> Any:
    if spec.layout == "ray":
        from harness.backends.ray_engine import RayEngineGroup

        return RayEngineGroup(build, num_engines=spec.num_engines, max_running=spec.max_running,
                              eos_token_id=task.eos_token_id, seed=spec.seed, num_threads=spec.threads, sink=sink,
                              max_seq_len=trainer.model.max_seq_len, broadcast=spec.broadcast,
                              address=spec.ray_address)
    if spec.layout == "split":
        from harness.backends.process_engine import ProcessEngine

        return ProcessEngine(build, trainer.get_weights(), max_running=spec.max_running,
                             eos_token_id=task.eos_token_id, seed=spec.seed, num_threads=spec.threads, sink=sink,
                             max_seq_len=trainer.model.max_seq_len)
    from harness.backends.torch_engine import EngineCore, TorchEngine

    engine_model = build()
    core = EngineCore(engine_model, max_running=spec.max_running, eos_token_id=task.eos_token_id)
    return TorchEngine(core, seed=spec.seed, sink=sink)  # it records its own generating phase and decode steps


def _engine_pids(engine: Any) -> list[int]:
    """The Ray layout's engine actors that run on this host (``RayEngineGroup.clock``)."""
    return [c["pid"] for c in getattr(engine, "clock", []) if c.get("shared") and c.get("pid")]


def _run_cpu_s(before: dict[str, Any], after: dict[str, Any], *, split: bool) -> float | None:
    """CPU seconds between two ``cpu_use`` snapshots: this process, plus the split layout's
    engine process (None: the engine's unreadable)."""
    own = after["main"] - before["main"]
    if not split:
        return own
    a, b = before["engines"][0], after["engines"][0]
    return None if a is None or b is None else own + b - a


async def _close(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if close is not None:
        await asyncio.to_thread(close)


REWARD_WINDOW = 5  # reward start / end: the mean of the first / last 5 steps (fewer in runs under 10 steps)


def summarize_mode(r: ModeResult, sync: ModeResult | None) -> ModeRow:
    """One row of the main job's table (one repeat of one mode). With ``sync`` (the sync
    run of the same repeat): speedup, ideal speedup, overlap efficiency and the loss
    table (``harness.measure.overlap_loss``)."""
    from harness.measure.overlap_loss import loss_table, step_parts

    rewards = r.per_step("train/reward_mean")
    k = max(1, min(REWARD_WINDOW, len(rewards) // 2))
    ages = [a for h in r.history for a in h.get("age_versions", [])]
    lags = [a for h in r.history for a in h.get("lag_steps", [])]
    taken = sum(1 for e in r.events if e.kind == ev.TAKEN)
    dropped = sum(1 for e in r.events if e.kind == ev.DROPPED)
    retried = sum(1 for e in r.events if e.kind == ev.RECYCLED)
    checks = {k2: v for k2, v in r.checks.items() if not k2.startswith("_")} if r.checks is not None else None
    row = ModeRow(
        mode=r.mode, steps=len(r.history), run_s=r.run_s,
        reward_start=sum(rewards[:k]) / k if rewards else None,
        reward_end=sum(rewards[-k:]) / k if rewards else None,
        reward_window=k, chance_level=r.chance_level,
        age_hist=histogram(ages), lag_hist=histogram(lags),
        dropped_share=dropped / taken if taken else 0.0, retried_share=retried / taken if taken else 0.0,
        lr=r.per_step("train/lr")[-1] if r.per_step("train/lr") else None,
        error=r.error, worker_error=r.worker_error, checks=checks,
        self_cost_share=r.self_cost["share_of_run"] if r.self_cost else None,
        **{f"peak_rss_{k2}_bytes": v for k2, v in r.peak_rss_bytes.items()},
        **(r.cpu_use or {}),
        **r.overlap,
    )
    if sync is not None and sync.history and r.history and r is not sync:
        per_step_sync = sync.overlap["wall_s"] / len(sync.history)
        per_step = r.overlap["wall_s"] / len(r.history)
        R = sync.overlap["rollout_busy_s"] / len(sync.history)
        T = (sync.overlap["train_busy_s"] + sync.overlap["weight_sync_s"]) / len(sync.history)
        ideal = ideal_speedup(R, T)
        row = dataclasses.replace(row, speedup=per_step_sync / per_step, ideal_speedup=ideal,
                                  overlap_efficiency=(per_step_sync / per_step) / ideal, sync_rollout_s=R,
                                  sync_train_s=T,
                                  losses=loss_table(step_parts(sync.events, sync.window, len(sync.history)),
                                                    step_parts(r.events, r.window, len(r.history))))
    return row


# not a median: a list, the per-repeat verdicts, the aggregate's own fields, or the spreads
_NOT_AGGREGATED = frozenset({"mode", "cpu_cores_per_engine", "checks", "repeats", "checks_passed", "losses_repeat",
                             *(f"{k}_{end}" for k in SPREAD_KEYS for end in ("min", "max"))})


def aggregate_repeats(rows: list[ModeRow]) -> ModeRow:
    """One mode's table row from its repeats' rows (``summarize_mode``): every numeric
    figure is the median over the repeats that have it; ``SPREAD_KEYS`` also get
    ``<key>_min`` and ``<key>_max``; the age and lag histograms add up over the repeats;
    the loss table is the one of the repeat whose overlap efficiency is the median (the
    lower middle one for an even count), so its parts sum to that repeat's gap;
    ``checks_passed`` is whether every repeat's trace passed every checker; ``error`` is
    the first error."""
    import statistics

    if not rows:
        raise ValueError("aggregate_repeats needs at least one row")
    out: dict[str, Any] = {"mode": rows[0].mode, "repeats": len(rows)}
    for f in dataclasses.fields(ModeRow):
        if f.name in _NOT_AGGREGATED:
            continue
        values = [getattr(r, f.name) for r in rows]
        values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if values:
            out[f.name] = statistics.median(values)
            if f.name in SPREAD_KEYS:
                out[f"{f.name}_min"], out[f"{f.name}_max"] = min(values), max(values)
    for key in ("age_hist", "lag_hist"):
        merged: dict[int, int] = {}
        for r in rows:
            for a, n in getattr(r, key).items():
                merged[a] = merged.get(a, 0) + n
        out[key] = dict(sorted(merged.items()))
    with_losses = sorted((r for r in rows if r.losses), key=lambda r: r.overlap_efficiency)
    if with_losses:
        median_row = with_losses[(len(with_losses) - 1) // 2]
        out["losses"] = median_row.losses
        out["losses_repeat"] = rows.index(median_row)
    out["checks_passed"] = all(r.checks["passed"] for r in rows if r.checks is not None)
    out["error"] = next((r.error for r in rows if r.error), None)
    out["worker_error"] = next((r.worker_error for r in rows if r.worker_error), None)
    return ModeRow(**out)
