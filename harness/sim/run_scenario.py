"""Run one scenario on virtual time with the simulated backends, and summarise it.

``simulate(scenario)`` wires the core's drivers to ``SimEngine`` and ``SimTrainer`` on a
fresh ``VirtualTimeLoop``, records a trace (unless ``trace=False``), and returns a
``SimResult``. Same scenario, same seed -> the identical trace, event for event.

Every run has a progress watchdog (``harness.sim.watchdog``, bounds from the scenario):
a hang or a runaway ends the run with ``WatchdogTripped`` as its ``error``.
A run that fails (a dead worker, a trainer exception, a deadlock, the watchdog) still returns a
result: ``error`` holds the exception and the trace holds everything up to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.contracts import NullSink
from miles_async_core.drivers import make_context, run
from miles_async_core.drivers.common import RunContext
from miles_async_core.types import Sample, SamplingParams
from harness.measure.ages import AgeRecorder
from harness.measure.overlap import measurement_window, overlap_metrics
from harness.sim.scenario import Scenario
from harness.sim.draws import BLOCK_BITS, BLOCK_MASK, MAX_BLOCKS, uniform, uniform_block
from harness.sim.engine import SimEngine
from harness.sim.fault_schedule import fault_engine_class
from harness.sim.trainer import SimTrainer
from harness.trace import Event, TraceRecorder
from harness.sim.vtime import run_virtual
from harness.sim.watchdog import for_scenario, install


@dataclass
class SimResult:
    scenario: Scenario
    history: list[dict]
    wall_s: float
    events: list[Event]
    engine_stats: dict[str, int]
    error: BaseException | None = None
    ctx: RunContext | None = field(default=None, repr=False)

    @property
    def config(self) -> AsyncConfig:
        return self.scenario.config


def sim_reward(seed: int) -> Callable[[Sample], float]:
    """A deterministic 0/1 reward keyed by (seed, sample index):
    ``1.0 if uniform(seed + 7, index) < 0.5 else 0.0``."""
    key0 = seed + 7
    blocks: dict[int, list[float]] = {}  # the rewards of a block of consecutive indices, as uniform draws them

    def reward(s: Sample) -> float:
        index = s.index
        if type(index) is int and 0 <= index < 1 << 62:
            rewards = blocks.get(index >> BLOCK_BITS)
            if rewards is None:
                if len(blocks) >= MAX_BLOCKS:
                    del blocks[next(iter(blocks))]  # the oldest block
                rewards = blocks[index >> BLOCK_BITS] = [
                    1.0 if u < 0.5 else 0.0 for u in uniform_block((key0, index >> BLOCK_BITS))
                ]
            return rewards[index & BLOCK_MASK]
        return 1.0 if uniform(key0, index) < 0.5 else 0.0

    return reward


def simulate(
    scenario: Scenario,
    *,
    trace: bool = True,
    buffer_factory: Callable | None = None,
    engine_factory: Callable | None = None,
    trainer_factory: Callable | None = None,
    hooks: Callable[[RunContext], None] | None = None,
) -> SimResult:
    """``engine_factory(cfg, sink)`` / ``trainer_factory(cfg)`` let suites swap in variants.
    A scenario's own faults (its ``[faults]`` table) are injected as ``run_with_faults`` does."""
    if scenario.faults is not None:
        f = scenario.faults
        engine_factory = fault_engine_class(engine_factory or SimEngine, f)
        scenario = dataclasses.replace(
            scenario,
            faults=None,
            engine=dataclasses.replace(scenario.engine, request_failure_rate=f.request_failure_rate),
            trainer=dataclasses.replace(scenario.trainer, fail_at_step=f.trainer_fail_at_step),
        )
    cfg = scenario.config
    prompt = [0] * scenario.engine.prompt_tokens
    holder: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sink = TraceRecorder(loop.time) if trace else NullSink()
        holder["sink"] = sink
        engine = (engine_factory or SimEngine)(scenario.engine, sink=sink)
        trainer = (trainer_factory or SimTrainer)(scenario.trainer)
        holder["engine"] = engine
        install(for_scenario(scenario, sink=sink, engine=engine))
        ctx = make_context(
            cfg,
            engine,
            trainer,
            lambda k: (f"prompt-{k}", prompt, k),
            sampling=SamplingParams(max_new_tokens=scenario.max_new_tokens),
            reward_fn=sim_reward(cfg.seed),
            sink=sink,
            observer=AgeRecorder(),
            buffer_factory=buffer_factory,
        )
        holder["ctx"] = ctx
        if hooks is not None:
            hooks(ctx)
        try:
            await run(ctx)
        finally:
            holder["t_end"] = loop.time()
            emit_run_end(ctx)

    error = None
    try:
        run_virtual(main())
    except (Exception, asyncio.CancelledError) as exc:  # the result carries it; suites decide if it was expected
        error = exc
    ctx = holder.get("ctx")
    sink = holder.get("sink")
    return SimResult(
        scenario=scenario,
        history=ctx.history if ctx else [],
        wall_s=holder.get("t_end", 0.0),
        events=sink.events if isinstance(sink, TraceRecorder) else [],
        engine_stats=dict(holder["engine"].stats) if "engine" in holder else {},
        error=error,
        ctx=ctx,
    )


def emit_run_end(ctx: RunContext) -> None:
    """Record what is still pending (buffered, in flight, recycled) so conservation can close
    (``simulate`` and the main job, ``harness.main_job.job.run_mode``, both end with it)."""
    if not ctx.sink.enabled:
        return
    pending: list[int] = []
    rollout_fn = ctx.rollout_manager.rollout_fn
    buffer = getattr(rollout_fn, "buffer", None)
    if buffer is not None and hasattr(buffer, "_buffer"):
        pending += [e.prompt_group[0].group_index for e in buffer._buffer]
    pending += list(getattr(rollout_fn, "in_flight_groups", {}))
    ds = getattr(ctx, "data_source", None)
    if ds is not None and hasattr(ds, "buffer"):
        pending += [g[0].group_index for g in ds.buffer]
    ctx.sink.emit(ev.RUN_END, pending_groups=pending)


def histogram(values: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


# The ratios `simulate` and `run` both report, defined once in harness.measure.overlap.
OVERLAP_RATIOS = ("both_busy_fraction", "rollout_idle_ratio", "train_idle_ratio", "wait_time_ratio")


def summarize(result: SimResult) -> dict[str, Any]:
    """The run's summary; phase time and the overlap ratios are measured over
    ``harness.measure.overlap.measurement_window`` (first generate to the last training
    step's end), exactly as the main job measures them."""
    h = result.history
    taken = sum(1 for e in result.events if e.kind == ev.TAKEN)
    handler = [e for e in result.events if e.kind == ev.HANDLER]
    dropped = [e for e in result.events if e.kind == ev.DROPPED]
    retried = sum(1 for e in result.events if e.kind == ev.RECYCLED)
    queue = [r.get("rollout/fully_async/queue_size") for r in h if "rollout/fully_async/queue_size" in r]
    o = overlap_metrics(result.events, measurement_window(result.events, 0.0, result.wall_s))
    return {
        "steps": len(h),
        "wall_s": result.wall_s,
        "age_versions": histogram([a for r in h for a in r.get("age_versions", [])]),
        "token_age_versions": histogram([a for r in h for a in r.get("token_age_versions", [])]),
        "lag_steps": histogram([a for r in h for a in r.get("lag_steps", [])]),
        "groups_taken": taken,
        "groups_trained": sum(len(r.get("age_versions", [])) for r in h),
        "dropped_share": len(dropped) / taken if taken else 0.0,
        "retried_share": retried / taken if taken else 0.0,
        "handler_calls": len(handler),
        "drop_reasons": histogram([e["reason"] for e in dropped]),
        "queue_size_mean": sum(queue) / len(queue) if queue else None,
        "queue_size_max": max(queue) if queue else None,
        # phase time and ratios: harness.measure.overlap, the same definition `run` reports
        "window_s": o["wall_s"],
        "train_waiting_s": o["train_waiting_s"],
        "train_training_s": o["train_busy_s"],
        "weight_sync_s": o["weight_sync_s"],
        "rollout_generating_s": o["rollout_busy_s"],
        "rollout_idle_s": max(0.0, o["wall_s"] - o["rollout_busy_s"]),
        **{k: o[k] for k in OVERLAP_RATIOS},
        "error": repr(result.error) if result.error else None,
    }


def format_summary(s: dict[str, Any]) -> str:
    def hist(d: dict) -> str:
        return " ".join(f"{k}:{v}" for k, v in d.items()) or "-"

    rows = [
        ("steps", s["steps"]),
        ("simulated wall time", f"{s['wall_s']:.2f} s (measured window {s['window_s']:.2f} s)"),
        ("age at training, versions (Miles: recorded)", hist(s["age_versions"])),
        ("age at training, versions (true: oldest token)", hist(s["token_age_versions"])),
        ("policy lag, optimizer steps", hist(s["lag_steps"])),
        ("groups taken / trained", f"{s['groups_taken']} / {s['groups_trained']}"),
        ("dropped share", f"{s['dropped_share']:.1%}  {hist(s['drop_reasons'])}"),
        ("retried share", f"{s['retried_share']:.1%}"),
        (
            "queue size mean / max",
            "-" if s["queue_size_mean"] is None else f"{s['queue_size_mean']:.1f} / {s['queue_size_max']:.0f}",
        ),
        ("trainer waiting", f"{s['train_waiting_s']:.2f} s ({s['wait_time_ratio']:.1%} of window)"),
        ("trainer training / weight sync", f"{s['train_training_s']:.2f} s / {s['weight_sync_s']:.2f} s"),
        ("trainer idle", f"{s['train_idle_ratio']:.1%} of window"),
        ("engine idle", f"{s['rollout_idle_s']:.2f} s ({s['rollout_idle_ratio']:.1%} of window)"),
        ("both busy", f"{s['both_busy_fraction']:.1%} of window"),
    ]
    if s["error"]:
        rows.append(("run failed", s["error"]))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
