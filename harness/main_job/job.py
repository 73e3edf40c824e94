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
(``harness.main_job.gap_replay``). ``run_mode(..., measure=False)`` runs with none of
it (no trace, no age observer, no gap, no checks): ``suites/bench/test_measurement_cost.py``
compares the two.

The pieces: ``spec`` (the settings and each mode's config), ``layouts`` (model, trainer,
engine), ``result`` (``ModeResult``), ``rows`` (the table's rows), ``gap_replay``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.backends.tasks import Task, get_task
from harness.backends.torch_trainer import TorchTrainer
from harness.main_job.gap_replay import GapRecorder, SteppedTrainer
from harness.main_job.layouts import (
    ModelBuilder,
    build_model_factory,
    close_engine,
    engine_pids,
    fresh_trainer,
    make_engine,
    prompt_fn,
    run_cpu_s,
)
from harness.main_job.result import CpuUse, ModeResult, StepMetrics
from harness.main_job.spec import RunSpec, mode_config
from harness.measure import cpu_use, host_load
from harness.measure.ages import AgeRecorder
from harness.measure.memory import PeakRss, read_peak_rss_bytes
from harness.measure.self_cost import SelfCost
from harness.sim.run_scenario import emit_run_end
from harness.trace import Event, TraceRecorder
from miles_async_core.config import AsyncConfig
from miles_async_core.contracts import EventSink, NullSink
from miles_async_core.drivers import make_context, run
from miles_async_core.drivers.common import RunContext
from miles_async_core.types import SamplingParams


def run_mode(
    mode: str,
    base: AsyncConfig,
    spec: RunSpec,
    *,
    on_step: Callable[[StepMetrics], object] | None = None,
    measure: bool = True,
    gap: bool | None = None,
) -> ModeResult:
    """One mode's run. ``measure=False``: no trace, no age observer, no gap and no checks
    (only ``run_s`` and the history are meaningful). ``gap`` overrides
    ``spec.gap_decomposition`` (the main job decomposes the first repeat only)."""
    config = mode_config(mode, base, spec)
    task = get_task(spec.task, **spec.task_kwargs())
    build = build_model_factory(spec, task)
    trainer = fresh_trainer(spec, build, config)
    decompose = measure and (spec.gap_decomposition if gap is None else gap)
    recorder = GapRecorder(spec, build, config) if decompose else None
    cost, memory = SelfCost(), PeakRss()
    memory.start("run")  # model builds and the timed run; "after_run": the gap replay and the checkers

    timed = asyncio.run(
        _timed_run(
            _Parts(
                spec=spec,
                config=config,
                task=task,
                build=build,
                trainer=trainer,
                recorder=recorder,
                on_step=on_step,
                cost=cost,
                measure=measure,
            )
        )
    )

    # after t1: nothing below is timed
    memory.start("after_run")
    gap_summary = recorder.finish(timed.history, trainer) if recorder is not None else None
    checks = None
    if measure:
        from harness.checking.invariants import check_report

        checks = check_report(timed.events, config, complete=timed.error is None)
    return ModeResult.from_trace(
        mode,
        config,
        timed.history,
        timed.events,
        timed.t0,
        timed.t1,
        error=timed.error,
        engine_sync=timed.engine_sync,
        gap_summary=gap_summary,
        checks=checks,
        chance_level=task.chance_level,
        run_s=timed.t1 - timed.t0,
        self_cost=cost.summary(timed.t1 - timed.t0) if measure else None,
        peak_rss_bytes={**memory.stop(), "engine_process": timed.engine_peak_rss_bytes},
        run_cpu_s=timed.run_cpu_s,
        cpu_use=timed.cpu_use,
        host=timed.host,
        engine_stats=timed.engine_stats,
        worker_error=timed.worker_error,
    )


@dataclass(frozen=True, kw_only=True)
class _Parts:
    """What the timed run is made of (built by ``run_mode`` before it starts)."""

    spec: RunSpec
    config: AsyncConfig
    task: Task
    build: ModelBuilder
    trainer: TorchTrainer
    recorder: GapRecorder | None
    on_step: Callable[[StepMetrics], object] | None
    cost: SelfCost
    measure: bool


@dataclass(frozen=True, kw_only=True)
class TimedRun:
    """What the timed window produced: the trace and history (a failed run keeps its
    finished steps, ``error`` says what happened), ``t0`` .. ``t1`` on the loop's clock,
    and what was read at its edges."""

    history: list[StepMetrics]
    events: list[Event]
    t0: float = 0.0
    t1: float = 0.0
    error: str | None = None
    worker_error: str | None = None  # a fully-async worker that died after the last drain
    cpu_use: CpuUse | None = None
    host: dict[str, Any] | None = None  # harness.measure.host_load.figures over t0 .. t1
    run_cpu_s: float | None = None
    engine_peak_rss_bytes: int | None = None  # the split layout's engine process
    engine_sync: list[dict[str, float]] | None = None
    engine_stats: dict[str, Any] | None = None


async def _timed_run(p: _Parts) -> TimedRun:
    """Build the engine and the driver's context, then time the driver's ``run`` (the
    window ``t0`` .. ``t1``): upstream's ``train.py`` / ``train_async.py`` loop on this
    layout. The run ends with ``RUN_END`` and the engine closed; an exception anywhere
    is the run's ``error``, never raised."""
    loop = asyncio.get_running_loop()
    recorded = TraceRecorder(loop.time) if p.measure else None
    sink = p.cost.sink(recorded) if p.measure else NullSink()
    engine: Any = None
    ctx: RunContext | None = None
    t0 = t1 = 0.0
    use: CpuUse | None = None
    host: dict[str, Any] | None = None
    cpu_s = peak = None
    error = None
    try:
        engine = make_engine(p.spec, p.build, p.trainer, p.task, sink)
        ctx = _context(p, engine, sink)
        child = getattr(getattr(engine, "process", None), "pid", None)  # the split layout's engine process
        pids = [child] if child is not None else engine_pids(engine)
        meter = host_load.Meter().start()
        use0 = cpu_use.snapshot(pids)
        t0 = loop.time()
        try:
            await run(ctx)
        finally:
            t1 = loop.time()
            use1 = cpu_use.snapshot(pids)
            use = CpuUse(**cpu_use.cores(use0, use1, t1 - t0))
            host = meter.stop()
            cpu_s = run_cpu_s(use0, use1, split=child is not None)
            emit_run_end(ctx)  # a no-op on the NullSink
            peak = read_peak_rss_bytes(child) if child is not None else None
            await close_engine(engine)
    except Exception as exc:  # finished steps are kept; the caller reports the error
        error = f"{type(exc).__name__}: {exc}"
    worker_error = getattr(ctx, "worker_error", None)
    return TimedRun(
        history=ctx.history if ctx is not None else [],
        events=recorded.events if recorded is not None else [],
        t0=t0,
        t1=t1,
        error=error,
        worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None,
        cpu_use=use,
        host=host,
        run_cpu_s=cpu_s,
        engine_peak_rss_bytes=peak,
        engine_sync=list(getattr(engine, "sync_s", [])),
        engine_stats=engine.stats() if hasattr(engine, "stats") else None,
    )


def _context(p: _Parts, engine: Any, sink: EventSink) -> RunContext:
    """The driver's ``RunContext``: the engine (seen by the gap recorder when it runs),
    the trainer (reporting each step), the task's prompts, sampling and reward, the trace
    sink and the age observer (both inside the recording's self-cost)."""
    if p.recorder is not None:
        engine = p.recorder.wrap_engine(engine, p.trainer)
    return make_context(
        p.config,
        engine,
        SteppedTrainer(p.trainer, p.on_step, p.recorder),
        prompt_fn(p.task, p.spec.seed),
        sampling=SamplingParams(max_new_tokens=p.task.max_new_tokens, temperature=1.0),
        reward_fn=p.task.reward,
        sink=sink,
        observer=p.cost.observer(AgeRecorder()) if p.measure else None,
    )
