"""One mode's run of the main job, as ``harness.main_job.job.run_mode`` returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.measure.overlap import measurement_window, overlap_metrics
from harness.trace import Event
from miles_async_core.config import AsyncConfig

StepMetrics = dict[str, Any]  # one finished train step's record (miles_async_core.drivers.common.RunContext.history)


@dataclass(frozen=True, kw_only=True)
class CpuUse:
    """``harness.measure.cpu_use.cores`` over the timed window: cores each process kept busy."""

    cpu_cores_main: float | None = None
    cpu_cores_per_engine: list[float | None] | None = None
    cpu_cores_engines: float | None = None
    cpu_cores_total: float | None = None
    host_cpu_count: int | None = None


@dataclass(frozen=True, kw_only=True)
class ModeResult:
    """One mode's run: its trace and history, and what was measured around the timed
    window ``t0`` .. ``t1`` (``window`` and ``overlap`` come from the trace,
    ``harness.measure.overlap``). A failed run keeps its finished steps; ``error`` says
    what happened."""

    mode: str
    config: AsyncConfig
    history: list[StepMetrics]
    events: list[Event]
    window: tuple[float, float]
    overlap: dict[str, float]
    engine_sync: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    gap_summary: dict[str, Any] | None = None
    worker_error: str | None = None  # a fully-async worker that died after the last drain
    checks: dict[str, Any] | None = None  # harness.checking.invariants.check_report of the trace (None: not checked)
    chance_level: float | None = None  # the task's: best prompt-blind policy's expected reward
    run_s: float = 0.0  # the driver's run, t1 - t0 (what measure=False times too)
    engine_stats: dict[str, Any] | None = None  # ray layout: RayEngineGroup.stats() (per engine, start-up, broadcast)
    self_cost: dict[str, Any] | None = None  # harness.measure.self_cost: the recording's own time inside t0 .. t1
    peak_rss_bytes: dict[str, int | None] = field(default_factory=dict)  # harness.measure.memory: run, after_run,
    # engine_process
    run_cpu_s: float | None = None  # CPU seconds of t0 .. t1, this process + the split engine process
    cpu_use: CpuUse | None = None
    host: dict[str, Any] | None = None  # harness.measure.host_load.figures over t0 .. t1: the share of the host

    def per_step(self, key: str) -> list[float]:
        return [r[key] for r in self.history if key in r]

    @classmethod
    def from_trace(
        cls,
        mode: str,
        config: AsyncConfig,
        history: list[StepMetrics],
        events: list[Event],
        t0: float,
        t1: float,
        **extra: Any,
    ) -> ModeResult:
        """A mode's result from its trace: window and overlap measured by
        ``harness.measure.overlap`` (the definition ``simulate`` reports too)."""
        window = measurement_window(events, t0, t1)
        return cls(
            mode=mode,
            config=config,
            history=history,
            events=events,
            window=window,
            overlap=overlap_metrics(events, window),
            **extra,
        )
